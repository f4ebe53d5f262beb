//! `bar-sim`: the seeded BAR benchmark (see `orchard_bar::sim`). Writes a JSON report and splices
//! the markdown tables into a file (`make bench-bar` targets `docs/BAR.md`); without `--out-md` the
//! markdown goes to stdout.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use orchard_bar::sim::report::{Report, render_markdown, splice};
use orchard_bar::sim::{SimConfig, run};
use orchard_bar::{EarlyStop, Fraction, GroupFilter, Params};

/// Compare GRPO, DAPO-style filtering, PODS-style down-sampling and Balanced Adaptive Rollout on simulated
/// prompts (common random numbers, seeded, deterministic).
#[derive(Debug, Parser)]
#[command(name = "bar-sim", version)]
struct Cli {
    /// Seed of every random stream.
    #[arg(long, default_value_t = 20_240_601)]
    seed: u64,
    /// Prompts simulated per grid cell.
    #[arg(long, default_value_t = 10_000)]
    prompts: u64,
    /// N: members of an admitted group.
    #[arg(long, default_value_t = 8)]
    group_size: u32,
    /// Nmax: trajectory budget per prompt; BAR runs with strides Nmax, Nmax/2 and Nmax/4.
    #[arg(long, default_value_t = 16)]
    max_trajectories: u32,
    /// Lower end of the target positive fraction.
    #[arg(long, default_value = "0.375")]
    positive_min: String,
    /// Upper end of the target positive fraction.
    #[arg(long, default_value = "0.625")]
    positive_max: String,
    /// Abort rates of the grid, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0,0.05,0.2")]
    abort_rates: Vec<f64>,
    /// Write the JSON report here.
    #[arg(long)]
    out_json: Option<PathBuf>,
    /// Splice the markdown section into this file (created if missing).
    #[arg(long)]
    out_md: Option<PathBuf>,
}

impl Cli {
    /// The flags that reproduce this run, as `make bench-bar` would spell them.
    fn command(&self) -> String {
        let mut command = format!(
            "cargo run --release -p orchard-bar --features sim --bin bar-sim -- --seed {} --prompts {} --group-size {} \
             --max-trajectories {} --positive-min {} --positive-max {} --abort-rates {}",
            self.seed,
            self.prompts,
            self.group_size,
            self.max_trajectories,
            self.positive_min,
            self.positive_max,
            self.abort_rates
                .iter()
                .map(f64::to_string)
                .collect::<Vec<_>>()
                .join(","),
        );
        if let Some(path) = &self.out_json {
            command.push_str(&format!(" --out-json {}", path.display()));
        }
        if let Some(path) = &self.out_md {
            command.push_str(&format!(" --out-md {}", path.display()));
        }
        command
    }

    fn params(&self) -> Result<Params, String> {
        let fraction = |flag: &str, text: &str| {
            Fraction::from_decimal_str(text).map_err(|error| format!("--{flag}: {error}"))
        };
        let params = Params {
            group_size: self.group_size,
            max_trajectories: self.max_trajectories,
            stride: self.max_trajectories,
            positive_min: fraction("positive-min", &self.positive_min)?,
            positive_max: fraction("positive-max", &self.positive_max)?,
            early_stop: EarlyStop::StrideBoundary,
            filter: GroupFilter::default_for(self.group_size),
        };
        params.validate().map_err(|error| error.to_string())?;
        if let Some(rate) = self
            .abort_rates
            .iter()
            .find(|rate| !(0.0..=1.0).contains(*rate))
        {
            return Err(format!(
                "--abort-rates: {rate} is not a probability in [0, 1]"
            ));
        }
        Ok(params)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match execute(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("bar-sim: {message}");
            ExitCode::FAILURE
        }
    }
}

fn execute(cli: &Cli) -> Result<(), String> {
    let params = cli.params()?;
    let config = SimConfig::standard(cli.seed, cli.prompts, params, &cli.abort_rates);
    let started = Instant::now();
    let cells = run(&config);
    eprintln!(
        "bar-sim: {} cells x {} methods x {} prompts in {:.1} s",
        config.cells.len(),
        config.methods.len(),
        config.prompts,
        started.elapsed().as_secs_f64()
    );
    let report = Report::new(&config, cli.command(), cells);
    if let Some(path) = &cli.out_json {
        let json = serde_json::to_string_pretty(&report)
            .map_err(|error| format!("encoding JSON: {error}"))?;
        std::fs::write(path, json + "\n")
            .map_err(|error| format!("writing {}: {error}", path.display()))?;
        eprintln!("bar-sim: wrote {}", path.display());
    }
    let section = render_markdown(&report);
    match &cli.out_md {
        Some(path) => {
            let existing = match std::fs::read_to_string(path) {
                Ok(text) => Some(text),
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
                Err(error) => return Err(format!("reading {}: {error}", path.display())),
            };
            std::fs::write(path, splice(existing.as_deref(), &section))
                .map_err(|error| format!("writing {}: {error}", path.display()))?;
            eprintln!("bar-sim: updated {}", path.display());
        }
        None => print!("{section}"),
    }
    Ok(())
}
