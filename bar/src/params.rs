//! The inputs of one BAR group (`groupSize`, `maxTrajectories`, `stride`, `positiveFraction`, `earlyStop`,
//! `filter`), their validation, and the exact integer bounds `n_min`, `n_max`, `n*` derived from them.

use super::fraction::Fraction;

/// When the engine may finish a group before the current stride is over (docs/BAR.md, "The schedule", step 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EarlyStop {
    /// The paper: try to assemble only when every launched trajectory is terminal.
    StrideBoundary,
    /// Ours: try after every terminal trajectory and stop as soon as a balanced group exists. Cheaper and
    /// faster, but it favours trajectories that finish first (usually shorter ones).
    Eager,
}

impl EarlyStop {
    /// The spelling used in the RolloutGroup spec (`StrideBoundary`, `Eager`).
    pub fn as_str(self) -> &'static str {
        match self {
            EarlyStop::StrideBoundary => "StrideBoundary",
            EarlyStop::Eager => "Eager",
        }
    }
}

/// The group-level filter (docs/BAR.md, step 6): drop groups that carry no learning signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GroupFilter {
    /// When false, no group is dropped for zero variance or backfill (a pool too small to fill N members
    /// is still dropped: a group always has exactly N members).
    pub enabled: bool,
    /// A group with more backfill (aborted) members than this is dropped. Default N/2 (rounded down).
    pub max_backfill: u32,
}

impl GroupFilter {
    /// The default filter for groups of `group_size`: enabled, `max_backfill = group_size / 2`.
    pub fn default_for(group_size: u32) -> GroupFilter {
        GroupFilter {
            enabled: true,
            max_backfill: group_size / 2,
        }
    }
}

/// Everything the engine needs to know about a group's spec.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Params {
    /// N: members of an admitted group, exactly.
    pub group_size: u32,
    /// Nmax: most trajectories ever launched for the group.
    pub max_trajectories: u32,
    /// s: trajectories launched together; divides Nmax.
    pub stride: u32,
    /// rho_min: lower end of the target share of positive members.
    pub positive_min: Fraction,
    /// rho_max: upper end of the target share of positive members.
    pub positive_max: Fraction,
    /// When a balanced group may be taken.
    pub early_stop: EarlyStop,
    /// The group-level filter.
    pub filter: GroupFilter,
}

impl Params {
    /// The paper's defaults: N = 8, Nmax = 16, s = 16, [0.375, 0.625], StrideBoundary, filter on.
    pub fn paper_defaults() -> Params {
        Params {
            group_size: 8,
            max_trajectories: 16,
            stride: 16,
            positive_min: Fraction::new(3, 8).unwrap_or(Fraction::ZERO),
            positive_max: Fraction::new(5, 8).unwrap_or(Fraction::ONE),
            early_stop: EarlyStop::StrideBoundary,
            filter: GroupFilter::default_for(8),
        }
    }

    /// Checks `1 <= N <= Nmax`, `stride >= 1`, `stride` divides `Nmax`, `0 <= min <= max <= 1`.
    ///
    /// The engine never panics on invalid params, but its answers are only meaningful for valid ones.
    /// An empty integer range (`n_min > n_max`, e.g. [0.4, 0.45] with N = 8) is valid: such a group can
    /// never be `Balanced` and always goes to the fallbacks.
    pub fn validate(&self) -> Result<(), ParamsError> {
        if self.group_size == 0 {
            return Err(ParamsError::ZeroGroupSize);
        }
        if self.group_size > self.max_trajectories {
            return Err(ParamsError::GroupLargerThanBudget {
                group_size: self.group_size,
                max_trajectories: self.max_trajectories,
            });
        }
        if self.stride == 0 {
            return Err(ParamsError::ZeroStride);
        }
        if !self.max_trajectories.is_multiple_of(self.stride) {
            return Err(ParamsError::StrideDoesNotDivide {
                stride: self.stride,
                max_trajectories: self.max_trajectories,
            });
        }
        if self.positive_max > Fraction::ONE {
            return Err(ParamsError::MaxAboveOne(self.positive_max));
        }
        if self.positive_min > self.positive_max {
            return Err(ParamsError::MinAboveMax {
                min: self.positive_min,
                max: self.positive_max,
            });
        }
        Ok(())
    }

    /// The exact integer bounds of this group; see [`bounds`].
    pub fn bounds(&self) -> Bounds {
        bounds(self)
    }
}

/// Why a [`Params`] is unusable; messages name the spec fields a user would fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamsError {
    /// N = 0.
    #[error("groupSize must be at least 1")]
    ZeroGroupSize,
    /// N > Nmax.
    #[error("groupSize ({group_size}) must not exceed maxTrajectories ({max_trajectories})")]
    GroupLargerThanBudget {
        /// N.
        group_size: u32,
        /// Nmax.
        max_trajectories: u32,
    },
    /// s = 0.
    #[error("stride must be at least 1")]
    ZeroStride,
    /// Nmax is not a multiple of s.
    #[error("stride ({stride}) must divide maxTrajectories ({max_trajectories})")]
    StrideDoesNotDivide {
        /// s.
        stride: u32,
        /// Nmax.
        max_trajectories: u32,
    },
    /// rho_max > 1.
    #[error("positiveFraction.max ({0}) must be at most 1")]
    MaxAboveOne(Fraction),
    /// rho_min > rho_max.
    #[error("positiveFraction.min ({min}) must not exceed positiveFraction.max ({max})")]
    MinAboveMax {
        /// rho_min.
        min: Fraction,
        /// rho_max.
        max: Fraction,
    },
}

/// The integer targets for the number of positive members n+ (docs/BAR.md, "Integer bounds").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bounds {
    /// `ceil(rho_min x N)`.
    pub n_min: u32,
    /// `floor(rho_max x N)`.
    pub n_max: u32,
    /// `floor(rho* x N + 1/2)` with `rho* = (rho_min + rho_max) / 2`: the preferred n+.
    pub n_star: u32,
}

/// Computes [`Bounds`] exactly on rationals: `0.3 x 10` gives `n_min = 3`, `0.7 x 10` gives 7.
///
/// `n* = floor((x + 1) / 2)` with `x = (rho_min + rho_max) N`, and `floor((x + 1) / 2)` equals
/// `floor((floor(x) + 1) / 2)` for every real x, so only `floor(x)` is needed. Values that do not fit a
/// `u32` (only possible with invalid params) saturate.
pub fn bounds(params: &Params) -> Bounds {
    let group_size = u64::from(params.group_size);
    let saturate = |value: u128| u32::try_from(value).unwrap_or(u32::MAX);
    let doubled_center = params
        .positive_min
        .floor_sum_times(params.positive_max, group_size);
    Bounds {
        n_min: saturate(params.positive_min.ceil_times(group_size)),
        n_max: saturate(params.positive_max.floor_times(group_size)),
        n_star: saturate(doubled_center.saturating_add(1) / 2),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(group_size: u32, min: &str, max: &str) -> Params {
        Params {
            group_size,
            max_trajectories: group_size.max(1).saturating_mul(2),
            stride: group_size.max(1),
            positive_min: Fraction::from_decimal_str(min).expect("decimal"),
            positive_max: Fraction::from_decimal_str(max).expect("decimal"),
            early_stop: EarlyStop::StrideBoundary,
            filter: GroupFilter::default_for(group_size),
        }
    }

    fn bounds_of(group_size: u32, min: &str, max: &str) -> (u32, u32, u32) {
        let b = bounds(&params(group_size, min, max));
        (b.n_min, b.n_max, b.n_star)
    }

    #[test]
    fn paper_defaults_are_3_to_5_around_4() {
        assert_eq!(Params::paper_defaults().validate(), Ok(()));
        assert_eq!(
            Params::paper_defaults().bounds(),
            Bounds {
                n_min: 3,
                n_max: 5,
                n_star: 4
            }
        );
        assert_eq!(bounds_of(8, "0.375", "0.625"), (3, 5, 4));
    }

    #[test]
    fn decimal_bounds_are_exact() {
        // 0.3 x 10 = 3 exactly: ceil is 3, not 4.
        assert_eq!(bounds_of(10, "0.3", "0.7"), (3, 7, 5));
        // 0.7 x 10 is 7.000000000000001 in f64; ceil must still be 7.
        assert_eq!(bounds_of(10, "0.7", "0.7"), (7, 7, 7));
        // 0.29 x 100 is 28.999999999999996 in f64; floor must be 29.
        assert_eq!(bounds_of(100, "0.29", "0.29"), (29, 29, 29));
        // 0.1 + 0.2 as an f64 is 0.30000000000000004: exactly that decimal, so ceil(x 10) = 4 while the
        // typed decimal 0.3 gives 3.
        let sum = Fraction::from_f64(0.1 + 0.2).expect("finite");
        let mut p = params(10, "0.3", "1");
        assert_eq!(bounds(&p).n_min, 3);
        p.positive_min = sum;
        assert_eq!(bounds(&p).n_min, 4);
        p.positive_min = Fraction::from_f64(0.3).expect("finite");
        assert_eq!(bounds(&p).n_min, 3);
        // 1/3-ish decimals: 0.3333333333333333 x 3 = 0.9999999999999999.
        assert_eq!(
            bounds_of(3, "0.3333333333333333", "0.6666666666666667"),
            (1, 2, 2)
        );
        // Here n_min > n_max (no balanced group exists) and n* = floor(0.9999999999999999 + 0.5) = 1.
        assert_eq!(
            bounds_of(3, "0.3333333333333333", "0.3333333333333333"),
            (1, 0, 1)
        );
        assert_eq!(
            bounds_of(6, "0.3333333333333333", "0.6666666666666667"),
            (2, 4, 3)
        );
    }

    #[test]
    fn center_rounds_half_up() {
        // rho* x N + 1/2 lands exactly on an integer: 0.5 x 5 + 0.5 = 3.
        assert_eq!(bounds_of(5, "0.4", "0.6"), (2, 3, 3));
        // rho* = 0.5, N = 8: 4 + 0.5 floors to 4.
        assert_eq!(bounds_of(8, "0.25", "0.75"), (2, 6, 4));
        // rho* = 0.3125, N = 8: 2.5 + 0.5 = 3.
        assert_eq!(bounds_of(8, "0.25", "0.375"), (2, 3, 3));
        // rho* = 0.30, N = 5: 1.5 + 0.5 = 2 exactly.
        assert_eq!(bounds_of(5, "0.2", "0.4"), (1, 2, 2));
        // rho* = 0.3 - 1e-17 style: 0.29999999999999999 and 0.3 with N = 5 -> x/2 just under 1.5.
        assert_eq!(bounds_of(5, "0.29999999999999999", "0.3"), (2, 1, 1));
    }

    #[test]
    fn edges_zero_and_one() {
        assert_eq!(bounds_of(8, "0", "0"), (0, 0, 0));
        assert_eq!(bounds_of(8, "1", "1"), (8, 8, 8));
        assert_eq!(bounds_of(8, "0", "1"), (0, 8, 4));
        assert_eq!(bounds_of(1, "0", "1"), (0, 1, 1));
        assert_eq!(bounds_of(7, "0", "1"), (0, 7, 4));
    }

    #[test]
    fn validation_names_the_field() {
        let mut p = Params::paper_defaults();
        p.group_size = 0;
        assert_eq!(p.validate(), Err(ParamsError::ZeroGroupSize));
        p.group_size = 17;
        assert!(matches!(
            p.validate(),
            Err(ParamsError::GroupLargerThanBudget { .. })
        ));
        p.group_size = 8;
        p.stride = 0;
        assert_eq!(p.validate(), Err(ParamsError::ZeroStride));
        p.stride = 5;
        assert_eq!(
            p.validate().map_err(|error| error.to_string()),
            Err("stride (5) must divide maxTrajectories (16)".to_string())
        );
        p.stride = 4;
        p.positive_max = Fraction::new(3, 2).expect("non-zero");
        assert!(matches!(p.validate(), Err(ParamsError::MaxAboveOne(_))));
        p.positive_max = Fraction::new(1, 4).expect("non-zero");
        assert_eq!(
            p.validate().map_err(|error| error.to_string()),
            Err(
                "positiveFraction.min (0.375) must not exceed positiveFraction.max (0.25)"
                    .to_string()
            )
        );
        p.positive_max = p.positive_min;
        assert_eq!(p.validate(), Ok(()));
    }

    #[test]
    fn invalid_params_do_not_panic() {
        let mut p = params(u32::MAX, "1", "1");
        p.positive_min = Fraction::new(u64::MAX, 1).expect("non-zero");
        p.positive_max = p.positive_min;
        let b = bounds(&p);
        assert_eq!((b.n_min, b.n_max, b.n_star), (u32::MAX, u32::MAX, u32::MAX));
    }
}
