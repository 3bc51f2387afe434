//! Integration tests of the API: the production wiring (`Application`) on
//! port 0 against a fresh Postgres database per test, driven over real HTTP.

mod artifacts;
mod auth;
mod checkpoints;
mod crashes;
mod divergence;
mod executors;
mod fencing;
mod health;
mod helpers;
mod jobs;
mod models;
mod openapi;
mod packages;
mod provisioner;
mod schema;
mod scripts;
mod sharing;
mod suspects;
mod sweeps;
mod tracking;
