//! A RolloutGroup spec as BAR engine parameters (pure). The CRD's CEL rules already reject invalid
//! specs at admission; this conversion is the exact-arithmetic bridge (decimal fractions become exact
//! rationals, so 0.3 x 10 gives 3) and a second line of defence with readable errors.

use orchard_api::{EarlyStop as ApiEarlyStop, RolloutGroupSpec};
use orchard_bar::{EarlyStop, Fraction, GroupFilter, Params};

/// The BAR parameters of `spec`, or why it cannot be run.
pub fn bar_params(spec: &RolloutGroupSpec) -> Result<Params, String> {
    let positive = |value: f64, field: &str| {
        Fraction::from_f64(value).map_err(|e| format!("positiveFraction.{field} = {value}: {e}"))
    };
    let count = |value: i32, field: &str| {
        u32::try_from(value)
            .ok()
            .filter(|v| *v > 0)
            .ok_or_else(|| format!("{field} must be positive, got {value}"))
    };
    let group_size = count(spec.group_size, "groupSize")?;
    let max_trajectories = count(spec.max_trajectories, "maxTrajectories")?;
    let stride = count(spec.stride.unwrap_or(spec.max_trajectories), "stride")?;
    let mut filter = GroupFilter::default_for(group_size);
    if let Some(configured) = &spec.filter {
        filter.enabled = configured.enabled;
        if let Some(max_backfill) = configured.max_backfill {
            filter.max_backfill = u32::try_from(max_backfill).map_err(|_| {
                format!("filter.maxBackfill must not be negative, got {max_backfill}")
            })?;
        }
    }
    let params = Params {
        group_size,
        max_trajectories,
        stride,
        positive_min: positive(spec.positive_fraction.min, "min")?,
        positive_max: positive(spec.positive_fraction.max, "max")?,
        early_stop: match spec.early_stop {
            ApiEarlyStop::StrideBoundary => EarlyStop::StrideBoundary,
            ApiEarlyStop::Eager => EarlyStop::Eager,
        },
        filter,
    };
    params.validate().map_err(|e| e.to_string())?;
    Ok(params)
}

#[cfg(test)]
mod tests {
    use super::*;
    use orchard_api::{GroupFilter as ApiFilter, PositiveFraction, SandboxSpec, SandboxTemplate};

    fn spec() -> RolloutGroupSpec {
        RolloutGroupSpec {
            launch_jitter_seconds: None,
            group_size: 10,
            max_trajectories: 20,
            stride: Some(5),
            positive_fraction: PositiveFraction { min: 0.3, max: 0.7 },
            early_stop: ApiEarlyStop::Eager,
            filter: None,
            template: SandboxTemplate {
                metadata: Default::default(),
                spec: SandboxSpec::default(),
            },
            trajectory_timeout_seconds: None,
            cleanup: Default::default(),
            queue: None,
            retry: None,
            active_deadline_seconds: None,
        }
    }

    #[test]
    fn decimal_fractions_become_exact_bounds() {
        let params = bar_params(&spec()).unwrap();
        let bounds = params.bounds();
        assert_eq!(bounds.n_min, 3, "ceil(0.3 x 10) is 3, not 4");
        assert_eq!(bounds.n_max, 7);
        assert_eq!(bounds.n_star, 5);
        assert_eq!(params.stride, 5);
        assert_eq!(params.early_stop, EarlyStop::Eager);
        assert_eq!(
            params.filter,
            GroupFilter {
                enabled: true,
                max_backfill: 5
            }
        );
    }

    #[test]
    fn stride_defaults_to_the_whole_budget_and_filters_are_configurable() {
        let mut s = spec();
        s.stride = None;
        s.filter = Some(ApiFilter {
            enabled: false,
            max_backfill: Some(2),
        });
        let params = bar_params(&s).unwrap();
        assert_eq!(params.stride, 20);
        assert_eq!(
            params.filter,
            GroupFilter {
                enabled: false,
                max_backfill: 2
            }
        );
    }

    #[test]
    fn invalid_specs_are_explained() {
        let mut s = spec();
        s.stride = Some(3);
        assert!(bar_params(&s).unwrap_err().contains("divide"));
        let mut s = spec();
        s.group_size = 0;
        assert!(bar_params(&s).unwrap_err().contains("groupSize"));
        let mut s = spec();
        s.positive_fraction.min = f64::NAN;
        assert!(bar_params(&s).unwrap_err().contains("positiveFraction.min"));
    }
}
