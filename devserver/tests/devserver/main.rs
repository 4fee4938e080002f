//! Tests of the dev server over HTTP: the recorded contract, the operator's
//! flow, faults, persistence, bad input, the events stream, rate limits,
//! HTTPS, Kubernetes auth against a real API server, and the other auth
//! methods and access scopes.

mod access;
mod common;
mod contract;
mod events;
mod faults;
mod flow;
mod fuzz;
mod https;
mod kubernetes;
mod limits;
mod persistence;
