//! How a limit's budget for one interval is split among the Envoys that
//! ask for it: max-min fair, from what every replica reports of its own.
//!
//! Each Envoy's demand is what it asked for over its last report (allowed
//! plus denied), as units per interval. When the demand of all Envoys fits
//! the budget, each gets its demand plus an equal part of what is left (so
//! an Envoy idle until now can still take a burst). When it does not fit,
//! each gets its demand capped at one level, the one where the capped
//! demands add up to the budget: an Envoy asking less than that level is
//! never denied, the others get the level.
//!
//! Replicas do not see each other's Envoys. Each adds, for a fixed ladder
//! of levels, the sum of its Envoys' demands capped at that level
//! ([`Ladder::capped`]); the store adds the replicas' sums, and every
//! replica reads back the same totals ([`Totals`]) and finds the level
//! between two rungs. The ladder is set by the limit's capacity, so every
//! replica uses the same one.

/// Rungs of the ladder: from the capacity down to 2^-(RUNGS-1)/4 of it.
pub(crate) const RUNGS: usize = 40;

/// Demands are added in thousandths of a unit (the store counts integers).
const MILLI: f64 = 1000.0;

/// The levels the replicas add their capped demands at.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ladder {
    capacity: f64,
}

impl Ladder {
    /// The ladder of a limit admitting `capacity` at once.
    pub(crate) fn new(capacity: u64) -> Self {
        Self {
            capacity: capacity.max(1) as f64,
        }
    }

    /// The level of rung `rung` (0: the capacity), in units per interval.
    pub(crate) fn level(self, rung: usize) -> f64 {
        self.capacity * (-(rung as f64) / 4.0).exp2()
    }

    /// What one replica adds for Envoys of `demands`: the sum of demands,
    /// the number of Envoys, and the sum capped at each rung — each in
    /// thousandths, as the store counts them.
    pub(crate) fn capped(self, demands: &[f64]) -> Totals {
        let sum = |cap: f64| demands.iter().map(|demand| demand.min(cap)).sum::<f64>();
        Totals {
            demand: to_milli(sum(f64::INFINITY)),
            envoys: demands.len() as u64,
            rungs: (0..RUNGS).map(|rung| to_milli(sum(self.level(rung)))).collect(),
        }
    }

    /// The split of `budget` units among all Envoys, from the `totals` of
    /// every replica added together.
    pub(crate) fn split(self, budget: f64, totals: &Totals) -> Split {
        let demand = from_milli(totals.demand);
        let envoys = totals.envoys.max(1) as f64;
        if demand <= budget {
            return Split::Spare {
                each: (budget - demand) / envoys,
            };
        }
        // The capped sum grows with the level; find the rungs around the
        // budget and interpolate between them.
        let mut above = (f64::INFINITY, demand);
        for rung in 0..RUNGS {
            let level = self.level(rung);
            let capped = from_milli(totals.rungs.get(rung).copied().unwrap_or(0));
            if capped <= budget {
                let (high_level, high_capped) = above;
                let level = if high_level.is_infinite() || high_capped <= capped {
                    level
                } else {
                    level + (budget - capped) * (high_level - level) / (high_capped - capped)
                };
                return Split::Level { level };
            }
            above = (level, capped);
        }
        // Below the last rung, each Envoy asks more than it: the capped sum
        // is the level times the Envoys.
        let (lowest, capped) = above;
        Split::Level {
            level: if capped > 0.0 { lowest * budget / capped } else { 0.0 },
        }
    }
}

/// What the replicas added for one interval (see [`Ladder::capped`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Totals {
    /// The demand of every Envoy, in thousandths.
    pub(crate) demand: u64,
    /// The Envoys.
    pub(crate) envoys: u64,
    /// The demand capped at each rung, in thousandths.
    pub(crate) rungs: Vec<u64>,
}

/// How a budget is split.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Split {
    /// Everyone's demand fits: each gets it, plus up to `each` more.
    Spare {
        /// What is left, split equally.
        each: f64,
    },
    /// Demands are capped at `level`.
    Level {
        /// The cap, in units per interval.
        level: f64,
    },
}

impl Split {
    /// True when an Envoy of `demand` gets less than it asks.
    pub(crate) fn caps(self, demand: f64) -> bool {
        matches!(self, Split::Level { level } if demand > level)
    }

    /// The share of an Envoy of `demand`, in units per interval.
    pub(crate) fn share(self, demand: f64) -> f64 {
        match self {
            Split::Spare { each } => demand + each,
            Split::Level { level } => demand.min(level),
        }
    }
}

fn to_milli(units: f64) -> u64 {
    (units * MILLI).round() as u64
}

fn from_milli(milli: u64) -> f64 {
    milli as f64 / MILLI
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn add(a: &Totals, b: &Totals) -> Totals {
        Totals {
            demand: a.demand + b.demand,
            envoys: a.envoys + b.envoys,
            rungs: a.rungs.iter().zip(&b.rungs).map(|(x, y)| x + y).collect(),
        }
    }

    #[test]
    fn demand_that_fits_is_met_with_the_spare_split_equally() {
        let ladder = Ladder::new(100);
        let demands = [20.0, 30.0, 40.0];
        let split = ladder.split(100.0, &ladder.capped(&demands));
        let shares: Vec<f64> = demands.iter().map(|&d| split.share(d)).collect();
        for (share, demand) in shares.iter().zip(demands) {
            assert!((share - demand - 10.0 / 3.0).abs() < 0.01, "{shares:?}");
        }
    }

    #[test]
    fn an_idle_envoy_gets_its_part_of_the_spare() {
        let ladder = Ladder::new(100);
        let split = ladder.split(100.0, &ladder.capped(&[10.0, 0.0]));
        assert!((split.share(10.0) - 55.0).abs() < 1e-9);
        assert!((split.share(0.0) - 45.0).abs() < 1e-9);
    }

    #[test]
    fn overload_is_split_max_min_fair() {
        let ladder = Ladder::new(100);
        let demands = [20.0, 80.0, 200.0];
        let split = ladder.split(100.0, &ladder.capped(&demands));
        let shares: Vec<f64> = demands.iter().map(|&d| split.share(d)).collect();
        assert!((shares[0] - 20.0).abs() < 1e-9, "{shares:?}");
        assert!((shares[1] - 40.0).abs() < 1.0, "{shares:?}");
        assert!((shares[2] - 40.0).abs() < 1.0, "{shares:?}");
    }

    #[test]
    fn replicas_adding_their_sums_split_as_one() {
        let ladder = Ladder::new(100);
        let one = ladder.capped(&[20.0, 80.0]);
        let other = ladder.capped(&[200.0]);
        let together = ladder.split(100.0, &add(&one, &other));
        let alone = ladder.split(100.0, &ladder.capped(&[20.0, 80.0, 200.0]));
        // The same level, but for the thousandths each replica rounds.
        match (together, alone) {
            (Split::Level { level: a }, Split::Level { level: b }) => assert!((a - b).abs() < 0.01, "{a} {b}"),
            other => panic!("{other:?}"),
        }
    }

    proptest! {
        /// Whatever the demands, the shares never add up to more than the
        /// budget by more than the ladder's rounding, an Envoy under the
        /// level gets all it asks, and every Envoy gets at least its demand
        /// or the level.
        #[test]
        fn shares_keep_the_budget(
            demands in proptest::collection::vec(0.0f64..500.0, 1..12),
            capacity in 1u64..10_000,
            budget_part in 0.0f64..1.0,
        ) {
            let ladder = Ladder::new(capacity);
            let budget = capacity as f64 * budget_part;
            let split = ladder.split(budget, &ladder.capped(&demands));
            let shares: Vec<f64> = demands.iter().map(|&d| split.share(d)).collect();
            let total: f64 = shares.iter().sum();
            let slack = 0.002 * demands.len() as f64;
            match split {
                Split::Spare { .. } => prop_assert!(total <= budget + slack, "{total} > {budget}"),
                Split::Level { level } => {
                    // The chord between two rungs lies under the capped
                    // sum: the level is at most one rung (2^1/4) too high.
                    prop_assert!(total <= budget * 1.19 + slack, "{total} > {budget}");
                    for (&share, &demand) in shares.iter().zip(&demands) {
                        if demand <= level {
                            prop_assert!((share - demand).abs() < 1e-9);
                        }
                    }
                }
            }
            for (&share, &demand) in shares.iter().zip(&demands) {
                match split {
                    Split::Spare { .. } => prop_assert!(share >= demand),
                    Split::Level { level } => prop_assert!(share >= demand.min(level) - 1e-9),
                }
            }
        }
    }
}
