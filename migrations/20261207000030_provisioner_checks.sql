-- The provisioner's states and event kinds are closed sets, the Rust enums
-- trainyard_common::api::{ProvisionedState, ProvisionerEventKind}; the
-- database refuses any other name.
ALTER TABLE provisioned_executors ADD CONSTRAINT provisioned_executors_state_known
    CHECK (state IN ('starting', 'running', 'stopping', 'stopped', 'exited', 'failed', 'gone'));
ALTER TABLE provisioner_events ADD CONSTRAINT provisioner_events_kind_known
    CHECK (kind IN ('start', 'release', 'stopped', 'exited', 'failed', 'blocked', 'adopted'));
