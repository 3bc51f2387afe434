-- TorchScript models: the executor that inspects the file, and what it found.

ALTER TABLE jobs
    -- The executor asked to load the model file while the job is `inspecting`.
    ADD COLUMN inspector uuid REFERENCES executors (id),
    -- The model's tensors ([{name, shape}]) as the inspection reported them;
    -- the planner sizes and shards TorchScript jobs from this.
    ADD COLUMN params jsonb;
