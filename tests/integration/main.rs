//! Integration tests of kms-operator on a real kube-apiserver + etcd.
//!
//! One test binary. The control plane comes from `KUBECONFIG` when it is set
//! (the test script starts one per run and exports it; any cluster works);
//! otherwise the harness starts the local one with `tests/testenv/testenv up`
//! under `target/testenv` and leaves it running for the next run. The CRDs
//! under `crds/` are applied once per run; every test works in namespaces of
//! its own.

mod harness;

mod cache;
mod chart_readme;
mod cli;
mod cloud_auth;
mod crds;
mod docs;
mod dynamic;
mod force_sync;
mod global_config;
mod handover;
mod helm;
mod kms_secret;
mod kms_secret_extras;
mod layout;
mod migrate;
mod mistakes;
mod observability;
mod push;
mod quickstart;
mod release;
mod reload;
mod security;
mod sharding;
mod support;
mod tenants;
