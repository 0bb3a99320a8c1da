//! envoyproxy/ratelimit's units (`SECOND` … `YEAR`): their lengths, their
//! names in YAML and in protobuf's JSON mapping, and their protobuf values.

use std::time::Duration;

use serde::{de, Deserialize, Deserializer, Serialize};

/// The units of envoyproxy/ratelimit, with their lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Unit {
    /// One second.
    Second,
    /// One minute.
    Minute,
    /// One hour.
    Hour,
    /// One day.
    Day,
    /// Seven days.
    Week,
    /// Thirty days, as envoyproxy/ratelimit counts a month.
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// Every unit, shortest first.
    pub const ALL: [Self; 7] = [
        Self::Second,
        Self::Minute,
        Self::Hour,
        Self::Day,
        Self::Week,
        Self::Month,
        Self::Year,
    ];

    /// The length of one unit.
    pub fn duration(self) -> Duration {
        let seconds = match self {
            Self::Second => 1,
            Self::Minute => 60,
            Self::Hour => 3_600,
            Self::Day => 86_400,
            Self::Week => 7 * 86_400,
            Self::Month => 30 * 86_400,
            Self::Year => 365 * 86_400,
        };
        Duration::from_secs(seconds)
    }

    /// The unit exactly `duration` long, if any.
    pub fn of_duration(duration: Duration) -> Option<Self> {
        Self::ALL.into_iter().find(|unit| unit.duration() == duration)
    }

    /// The protobuf enum value of `envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit`.
    pub fn proto(self) -> i32 {
        match self {
            Self::Second => 1,
            Self::Minute => 2,
            Self::Hour => 3,
            Self::Day => 4,
            Self::Month => 5,
            Self::Year => 6,
            Self::Week => 7,
        }
    }

    /// The unit of a protobuf enum value (`None` for `UNKNOWN` and values
    /// this version does not know).
    pub fn from_proto(value: i32) -> Option<Self> {
        Self::ALL.into_iter().find(|unit| unit.proto() == value)
    }

    /// The name in protobuf's JSON mapping (`"SECOND"`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Second => "SECOND",
            Self::Minute => "MINUTE",
            Self::Hour => "HOUR",
            Self::Day => "DAY",
            Self::Week => "WEEK",
            Self::Month => "MONTH",
            Self::Year => "YEAR",
        }
    }

    /// Reads a unit name in any case (`second`, `SECOND`).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|unit| unit.name().eq_ignore_ascii_case(name))
    }

    /// The message for a name that is no unit.
    pub(crate) fn unknown(name: &str) -> String {
        format!("unknown unit \"{name}\" (expected second, minute, hour, day, week, month or year)")
    }
}

impl<'de> Deserialize<'de> for Unit {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        Self::parse(&name).ok_or_else(|| de::Error::custom(Self::unknown(&name)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_lengths_and_protobuf_values_agree() {
        for unit in Unit::ALL {
            assert_eq!(Unit::parse(unit.name()), Some(unit));
            assert_eq!(Unit::parse(&unit.name().to_ascii_lowercase()), Some(unit));
            assert_eq!(Unit::from_proto(unit.proto()), Some(unit));
            assert_eq!(Unit::of_duration(unit.duration()), Some(unit));
        }
        assert_eq!(Unit::from_proto(0), None);
        assert_eq!(Unit::parse("fortnight"), None);
        assert_eq!(Unit::of_duration(Duration::from_secs(2)), None);
        assert_eq!(Unit::Month.duration(), Duration::from_secs(30 * 86_400));
    }
}
