//! End-to-end tests: the real `trainyard` and `trainyard-executor` binaries
//! started as processes.

mod async_ps;
mod chaos;
mod checkpoints;
mod cli;
mod cluster;
mod data_formats;
mod data_policy;
mod divergence;
mod examples;
mod executor_probe;
mod netwall;
mod partitions;
mod provisioner;
mod replicas;
mod sandbox;
mod scripts;
mod scripts_as_written;
mod scripts_compile;
mod server_lifecycle;
mod sharded;
mod sharing;
mod shutdown;
mod slurm;
mod sweeps;
mod tracking;
mod training;
mod user_models;
mod watchdog;
mod web;
