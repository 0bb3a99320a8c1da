//! Calendar periods for window limits: days, weeks (ISO: from Monday),
//! months and years in a named time zone, with DST and month lengths exact
//! (the time zone database through `jiff`). A monthly token budget follows
//! the billing month, not 30 days.
//!
//! A [`Calendar`] is `Copy`, so that the limits carrying one stay `Copy`:
//! its zone is interned once per name for the life of the process (a
//! service sees a handful of zones).
//!
//! In Redis the Lua library cannot read a time zone database, so the client
//! sends the boundaries around its own clock ([`Calendar::bounds_around`]:
//! the starts of the previous, current and next periods and of the one after)
//! and the server picks the period holding its own time; a period is a day
//! or longer, so only a clock a whole period away could miss it.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, PoisonError};

use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::{Span, Timestamp, ToSpan};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A calendar period a window follows.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Period {
    /// From midnight to midnight (23 or 25 hours across a DST change).
    Day,
    /// From Monday's midnight to the next Monday's (ISO weeks).
    Week,
    /// From the first of the month to the first of the next.
    Month,
    /// From the first of January to the next.
    Year,
}

impl Period {
    /// The first day of the period holding `date`.
    fn start(self, date: Date) -> Date {
        match self {
            Self::Day => date,
            Self::Week => date
                .checked_sub(i64::from(date.weekday().to_monday_zero_offset()).days())
                .unwrap_or(date),
            Self::Month => date.first_of_month(),
            Self::Year => date.first_of_year(),
        }
    }

    /// One period, in civil time.
    fn span(self) -> Span {
        match self {
            Self::Day => 1.day(),
            Self::Week => 1.week(),
            Self::Month => 1.month(),
            Self::Year => 1.year(),
        }
    }

    /// The first day of the period after the one starting on `start`.
    fn next(self, start: Date) -> Option<Date> {
        start.checked_add(self.span()).ok()
    }

    /// The first day of the period before the one starting on `start`.
    #[cfg_attr(not(feature = "engine"), allow(dead_code))]
    fn previous(self, start: Date) -> Option<Date> {
        start.checked_sub(self.span()).ok()
    }
}

/// A time zone by name, interned.
#[derive(Debug)]
struct Zone {
    name: String,
    tz: TimeZone,
}

/// A calendar period in a time zone.
#[derive(Debug, Clone, Copy)]
pub struct Calendar {
    pub(crate) period: Period,
    zone: &'static Zone,
}

impl PartialEq for Calendar {
    fn eq(&self, other: &Self) -> bool {
        self.period == other.period && self.zone.name == other.zone.name
    }
}

impl Eq for Calendar {}

/// The zone named `name` (an IANA name such as `Europe/Paris`, or `UTC`),
/// read once.
fn zone(name: &str) -> Result<&'static Zone> {
    static ZONES: OnceLock<Mutex<HashMap<String, &'static Zone>>> = OnceLock::new();
    let mut zones = ZONES
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(zone) = zones.get(name) {
        return Ok(zone);
    }
    let tz = TimeZone::get(name).map_err(|_| {
        Error::invalid_limit(format!(
            "time_zone: unknown time zone \"{name}\" (an IANA name such as Europe/Paris)"
        ))
    })?;
    let zone: &'static Zone = Box::leak(Box::new(Zone {
        name: name.to_owned(),
        tz,
    }));
    zones.insert(name.to_owned(), zone);
    Ok(zone)
}

impl Calendar {
    /// `period` in the time zone named `time_zone` (`None`: UTC).
    ///
    /// # Errors
    ///
    /// An unknown time zone, naming `time_zone`.
    pub(crate) fn new(period: Period, time_zone: Option<&str>) -> Result<Self> {
        Ok(Self {
            period,
            zone: zone(time_zone.unwrap_or("UTC"))?,
        })
    }

    /// The instant (µs since the epoch) the day `date` starts in the zone.
    fn instant(&self, date: Date) -> Option<u64> {
        let zoned = date.to_zoned_datetime(self.zone.tz.clone()).ok()?;
        u64::try_from(zoned.timestamp().as_microsecond()).ok()
    }

    /// The first day of the period holding `now` (µs since the epoch).
    fn start_date(&self, now: u64) -> Option<Date> {
        let now = Timestamp::from_microsecond(i64::try_from(now).ok()?).ok()?;
        Some(self.period.start(now.to_zoned_datetime(self.zone.tz.clone()).date()))
    }

    /// The end of the period holding `now` (µs since the epoch), when the
    /// calendar reaches that far.
    pub(crate) fn end_of(&self, now: u64) -> Option<u64> {
        let start = self.start_date(now)?;
        self.instant(self.period.next(start)?)
    }

    /// The starts of the previous, current and next periods around `now`,
    /// and of the one after: what the Redis library picks the period of the
    /// server's time from.
    #[cfg_attr(not(feature = "engine"), allow(dead_code))]
    pub(crate) fn bounds_around(&self, now: u64) -> Option<[u64; 4]> {
        let current = self.start_date(now)?;
        let previous = self.period.previous(current)?;
        let next = self.period.next(current)?;
        let after = self.period.next(next)?;
        Some([
            self.instant(previous)?,
            self.instant(current)?,
            self.instant(next)?,
            self.instant(after)?,
        ])
    }
}

/// The end of the period holding `now` among `bounds` (rising starts of
/// consecutive periods): `None` when `now` is before the first or at or
/// after the last.
pub(crate) fn end_among(bounds: &[u64; 4], now: u64) -> Option<u64> {
    bounds
        .windows(2)
        .find(|pair| pair[0] <= now && now < pair[1])
        .map(|pair| pair[1])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// µs since the epoch of `text`, an RFC 3339 instant.
    fn at(text: &str) -> u64 {
        let timestamp: Timestamp = text.parse().unwrap();
        u64::try_from(timestamp.as_microsecond()).unwrap()
    }

    fn hours(start: u64, end: u64) -> u64 {
        (end - start) / 3_600_000_000
    }

    #[test]
    fn a_day_across_a_dst_change_is_23_or_25_hours() {
        let paris = Calendar::new(Period::Day, Some("Europe/Paris")).unwrap();
        // 2026-03-29: clocks go forward at 02:00 (CET to CEST).
        let noon = at("2026-03-29T10:00:00Z");
        let end = paris.end_of(noon).unwrap();
        assert_eq!(end, at("2026-03-29T22:00:00Z"), "midnight CEST");
        let start = paris.bounds_around(noon).unwrap()[1];
        assert_eq!(start, at("2026-03-28T23:00:00Z"), "midnight CET");
        assert_eq!(hours(start, end), 23);
        // 2026-10-25: back to CET, a day of 25 hours.
        let [_, start, end, _] = paris.bounds_around(at("2026-10-25T12:00:00Z")).unwrap();
        assert_eq!(hours(start, end), 25);
        // New York changes on other days (2026-03-08).
        let new_york = Calendar::new(Period::Day, Some("America/New_York")).unwrap();
        let [_, start, end, _] = new_york.bounds_around(at("2026-03-08T17:00:00Z")).unwrap();
        assert_eq!((start, hours(start, end)), (at("2026-03-08T05:00:00Z"), 23));
    }

    #[test]
    fn months_have_their_own_lengths_and_leap_days_count() {
        let utc = Calendar::new(Period::Month, None).unwrap();
        let days = |now: &str| {
            let [_, start, end, _] = utc.bounds_around(at(now)).unwrap();
            (end - start) / 86_400_000_000
        };
        assert_eq!(days("2027-02-14T00:00:00Z"), 28);
        assert_eq!(days("2028-02-29T12:00:00Z"), 29, "a leap year's February");
        assert_eq!(days("2027-01-31T23:59:59Z"), 31);
        assert_eq!(days("2027-04-30T23:59:59Z"), 30);
        // The leap day itself is a day of its own.
        let day = Calendar::new(Period::Day, None).unwrap();
        assert_eq!(day.end_of(at("2028-02-29T08:00:00Z")), Some(at("2028-03-01T00:00:00Z")));
        let year = Calendar::new(Period::Year, None).unwrap();
        let [_, start, end, _] = year.bounds_around(at("2028-07-01T00:00:00Z")).unwrap();
        assert_eq!((end - start) / 86_400_000_000, 366);
    }

    #[test]
    fn two_zones_start_the_day_at_their_own_midnight() {
        let tokyo = Calendar::new(Period::Day, Some("Asia/Tokyo")).unwrap();
        let utc = Calendar::new(Period::Day, Some("UTC")).unwrap();
        let now = at("2027-01-01T20:00:00Z");
        // 05:00 on the 2nd in Tokyo; 20:00 on the 1st in UTC.
        assert_eq!(tokyo.end_of(now), Some(at("2027-01-02T15:00:00Z")));
        assert_eq!(utc.end_of(now), Some(at("2027-01-02T00:00:00Z")));
        // Weeks start on Monday: 2027-01-01 is a Friday.
        let week = Calendar::new(Period::Week, Some("UTC")).unwrap();
        assert_eq!(week.bounds_around(now).unwrap()[1], at("2026-12-28T00:00:00Z"));
        assert_eq!(week.end_of(now), Some(at("2027-01-04T00:00:00Z")));
        // A month in Tokyo ends 9 hours before UTC's.
        let month = Calendar::new(Period::Month, Some("Asia/Tokyo")).unwrap();
        assert_eq!(
            month.end_of(at("2027-01-15T00:00:00Z")),
            Some(at("2027-01-31T15:00:00Z"))
        );
    }

    #[test]
    fn the_server_picks_its_period_among_the_bounds() {
        let month = Calendar::new(Period::Month, Some("Europe/Paris")).unwrap();
        let bounds = month.bounds_around(at("2027-03-15T00:00:00Z")).unwrap();
        // A server a little ahead, past the end of March: April's end.
        assert_eq!(
            end_among(&bounds, at("2027-04-02T00:00:00Z")),
            month.end_of(at("2027-04-02T00:00:00Z"))
        );
        assert_eq!(end_among(&bounds, at("2027-03-15T00:00:00Z")), Some(bounds[2]));
        assert_eq!(end_among(&bounds, bounds[0] - 1), None);
        assert_eq!(end_among(&bounds, bounds[3]), None);
    }

    #[test]
    fn unknown_zones_are_refused_by_name() {
        let error = Calendar::new(Period::Day, Some("Mars/Olympus")).unwrap_err();
        assert!(error.to_string().contains("time_zone"), "{error}");
        assert!(error.to_string().contains("Mars/Olympus"), "{error}");
    }
}
