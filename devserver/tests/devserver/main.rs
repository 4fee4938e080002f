//! Tests of the dev server over HTTP: the recorded contract, the operator's
//! flow, faults, persistence, bad input.

mod common;
mod contract;
mod faults;
mod flow;
mod fuzz;
mod persistence;
