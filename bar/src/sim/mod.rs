//! `bar-sim`: the seeded benchmark of docs/BAR.md ("Benchmark"), comparing GRPO, DAPO-style filtering,
//! PODS-style down-sampling and BAR (the real [`crate`] engine) over a grid of pass-rate
//! distributions, abort rates and duration models, with common random numbers.
//!
//! This module owns the simulation and its report; the `bar-sim` binary only parses flags and writes files.
//! Layout: [`rng`] (deterministic PRNG and samplers), [`scenario`] (distributions and draws), [`methods`]
//! (the rollout methods on one prompt), [`metrics`] (per-method sums), [`report`] (JSON and markdown),
//! [`retries`] (what the operator's OOM retries do to the draws BAR sees, and the tests that they
//! leave its groups unchanged).
//! It is a benchmark, not a test: its numbers are reported, not asserted (the tests check the simulator
//! itself against closed-form binomial expectations).

pub mod methods;
pub mod metrics;
pub mod report;
pub mod retries;
pub mod rng;
pub mod scenario;

#[cfg(test)]
mod closed_form_tests;

use serde::Serialize;

use crate::Params;
use methods::{Method, run_prompt};
use metrics::{Accumulator, Summary};
use scenario::{Cell, Draw, DurationModel, PassRate};

/// What to simulate.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// The seed of every stream.
    pub seed: u64,
    /// Prompts per cell.
    pub prompts: u64,
    /// N, Nmax, the positive fraction and the filter (the stride and early-stop mode come from each
    /// [`Method::Bar`]).
    pub params: Params,
    /// The grid.
    pub cells: Vec<Cell>,
    /// The methods compared in every cell.
    pub methods: Vec<Method>,
}

impl SimConfig {
    /// The grid of docs/BAR.md: the four standard pass-rate distributions x `abort_rates` x both duration
    /// models, with [`Method::standard_set`].
    pub fn standard(seed: u64, prompts: u64, params: Params, abort_rates: &[f64]) -> SimConfig {
        let mut cells = Vec::new();
        for pass_rate in PassRate::standard_grid() {
            for &abort_rate in abort_rates {
                for durations in [DurationModel::Independent, DurationModel::CorrectShorter] {
                    cells.push(Cell {
                        pass_rate,
                        abort_rate,
                        durations,
                    });
                }
            }
        }
        let methods = Method::standard_set(params.max_trajectories);
        SimConfig {
            seed,
            prompts,
            params,
            cells,
            methods,
        }
    }
}

/// The results of one method in one cell.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MethodResult {
    /// Which method.
    pub method: Method,
    /// Its table label.
    pub label: String,
    /// Its metrics.
    pub summary: Summary,
}

/// The results of one cell.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CellResult {
    /// The cell.
    pub cell: Cell,
    /// One entry per method, in the config's order.
    pub methods: Vec<MethodResult>,
}

/// Simulates every method on `config.prompts` prompts of `cell`, with common random numbers.
pub fn run_cell(config: &SimConfig, cell: &Cell) -> CellResult {
    let params = &config.params;
    let needed = config
        .methods
        .iter()
        .map(|method| method.draws_needed(params))
        .max()
        .unwrap_or(0);
    let mut accumulators = vec![Accumulator::default(); config.methods.len()];
    for prompt in 0..config.prompts {
        let pass_rate = cell.pass_rate.sample(config.seed, prompt);
        let draws = Draw::sample_prompt(config.seed, prompt, needed, pass_rate, cell);
        for (method, accumulator) in config.methods.iter().zip(&mut accumulators) {
            let run = run_prompt(*method, params, &draws);
            accumulator.add(&run, &draws, params.group_size);
        }
    }
    CellResult {
        cell: *cell,
        methods: config
            .methods
            .iter()
            .zip(&accumulators)
            .map(|(method, accumulator)| MethodResult {
                method: *method,
                label: method.label(params),
                summary: accumulator.summary(),
            })
            .collect(),
    }
}

/// Simulates the whole grid.
pub fn run(config: &SimConfig) -> Vec<CellResult> {
    config
        .cells
        .iter()
        .map(|cell| run_cell(config, cell))
        .collect()
}
