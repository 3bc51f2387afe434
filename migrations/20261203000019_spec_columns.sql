-- The spec fields that queries filter on, as columns. They are generated
-- from the stored spec by Postgres, so they cannot disagree with it, and
-- no query reads the spec's JSON by path.
ALTER TABLE jobs
    -- `model.kind`: "mlp", "cnn", "transformer", "torchscript", ...
    ADD COLUMN model_kind text GENERATED ALWAYS AS (spec -> 'model' ->> 'kind') STORED,
    -- `watchdog.exclude_stragglers`, false when the spec leaves it out.
    ADD COLUMN exclude_stragglers boolean NOT NULL GENERATED ALWAYS AS (
        coalesce((spec -> 'watchdog' ->> 'exclude_stragglers')::boolean, false)
    ) STORED;
