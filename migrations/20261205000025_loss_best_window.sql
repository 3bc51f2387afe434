-- The lowest mean of `divergence.window_steps` rank-0 losses in a row a
-- job's curve has come down to (api/src/divergence.rs): a loss that
-- climbs back far above it has collapsed.
ALTER TABLE jobs ADD COLUMN loss_best_window double precision;
