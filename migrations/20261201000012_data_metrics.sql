-- What a sharded dataset's loader did in each step: bytes read (from the
-- store or local files), shard reads the executor's cache answered or that
-- went to the store, and shards fetched ahead. Zero for data in memory.
ALTER TABLE job_metrics
    ADD COLUMN data_bytes_read BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN data_cache_hits INTEGER NOT NULL DEFAULT 0,
    ADD COLUMN data_cache_misses INTEGER NOT NULL DEFAULT 0,
    ADD COLUMN prefetch_depth INTEGER NOT NULL DEFAULT 0;
