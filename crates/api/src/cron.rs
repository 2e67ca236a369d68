//! Five-field cron schedules (`minute hour day-of-month month day-of-week`), evaluated in UTC.
//!
//! The syntax is the standard one Karpenter's disruption budgets accept (robfig/cron's
//! standard parser): each field is `*`, a number, a range `a-b`, a step `*/n` or `a-b/n`, or
//! a comma-separated list of those; months and weekdays also take their three-letter English
//! names (`jan`, `mon`, case-insensitive); day-of-week 7 is Sunday like 0; the macros
//! `@yearly`, `@annually`, `@monthly`, `@weekly`, `@daily`, `@midnight` and `@hourly` stand
//! for their usual schedules. As in Vixie cron, when both day-of-month and day-of-week are
//! restricted (neither starts with `*`), a day matches if **either** matches.
//!
//! [`Schedule::last_start`] answers the question a time window asks: when did the schedule
//! last fire at or before `now`, looking back no further than a bound. Pure, no I/O.

use jiff::{Timestamp, ToSpan, tz::TimeZone};

/// Why a schedule could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CronError {
    /// Not five fields (and no known macro).
    #[error("schedule {0:?} must have 5 fields (minute hour day-of-month month day-of-week)")]
    FieldCount(String),
    /// A field that is not valid cron syntax or out of range.
    #[error("invalid {field} field {value:?} (allowed {min}-{max})")]
    Field {
        /// Which field.
        field: &'static str,
        /// Its text.
        value: String,
        /// Smallest allowed value.
        min: u8,
        /// Largest allowed value.
        max: u8,
    },
}

/// A parsed five-field cron schedule (UTC).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    minutes: u64,
    hours: u64,
    days_of_month: u64,
    months: u64,
    days_of_week: u64,
    dom_restricted: bool,
    dow_restricted: bool,
}

const MONTHS: [&str; 12] = [
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];
const WEEKDAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

impl Schedule {
    /// Parses a schedule.
    pub fn parse(text: &str) -> Result<Schedule, CronError> {
        let expanded = match text.trim() {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            other => other,
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        let [minute, hour, dom, month, dow] = fields[..] else {
            return Err(CronError::FieldCount(text.to_owned()));
        };
        let mut days_of_week = field(dow, "day-of-week", 0, 7, &WEEKDAYS)?;
        if days_of_week & (1 << 7) != 0 {
            days_of_week = (days_of_week & !(1 << 7)) | 1;
        }
        Ok(Schedule {
            minutes: field(minute, "minute", 0, 59, &[])?,
            hours: field(hour, "hour", 0, 23, &[])?,
            days_of_month: field(dom, "day-of-month", 1, 31, &[])?,
            months: field(month, "month", 1, 12, &MONTHS)?,
            days_of_week,
            dom_restricted: !dom.starts_with('*'),
            dow_restricted: !dow.starts_with('*'),
        })
    }

    /// Whether the schedule fires in the minute of `t` (UTC).
    pub fn matches(&self, t: Timestamp) -> bool {
        let dt = t.to_zoned(TimeZone::UTC).datetime();
        let bit = |set: u64, v: i64| u32::try_from(v).is_ok_and(|v| v < 64 && set & (1 << v) != 0);
        let dom = bit(self.days_of_month, i64::from(dt.day()));
        let dow = bit(
            self.days_of_week,
            i64::from(dt.weekday().to_sunday_zero_offset()),
        );
        let day = if self.dom_restricted && self.dow_restricted {
            dom || dow
        } else {
            dom && dow
        };
        day && bit(self.minutes, i64::from(dt.minute()))
            && bit(self.hours, i64::from(dt.hour()))
            && bit(self.months, i64::from(dt.month()))
    }

    /// The latest minute at or before `now` at which the schedule fired, looking back at
    /// most `within` (`None` when it did not fire in that span). Steps minute by minute, so
    /// `within` should stay within days (a window of 31 days is 44 640 steps).
    pub fn last_start(&self, now: Timestamp, within: std::time::Duration) -> Option<Timestamp> {
        let floor = now.as_second() - now.as_second().rem_euclid(60);
        let start = Timestamp::from_second(floor).ok()?;
        let steps = within.as_secs() / 60;
        (0..=steps)
            .filter_map(|i| start.checked_sub(i64::try_from(i).ok()?.minutes()).ok())
            .take_while(|t| now.duration_since(*t).unsigned_abs() <= within)
            .find(|t| self.matches(*t))
    }
}

/// Parses one field into a bit set of the allowed values.
fn field(
    text: &str,
    name: &'static str,
    min: u8,
    max: u8,
    names: &[&str],
) -> Result<u64, CronError> {
    let bad = || CronError::Field {
        field: name,
        value: text.to_owned(),
        min,
        max,
    };
    let value = |s: &str| -> Result<u8, CronError> {
        let lower = s.to_ascii_lowercase();
        if let Some(i) = names.iter().position(|n| *n == lower) {
            let offset = if min == 1 { 1 } else { 0 };
            return u8::try_from(i + offset).map_err(|_| bad());
        }
        let v: u8 = s.parse().map_err(|_| bad())?;
        if v < min || v > max {
            return Err(bad());
        }
        Ok(v)
    };
    let mut set = 0u64;
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => {
                let step: u8 = s.parse().map_err(|_| bad())?;
                if step == 0 {
                    return Err(bad());
                }
                (r, step)
            }
            None => (part, 1),
        };
        let (lo, hi) = if range == "*" {
            (min, max)
        } else if let Some((a, b)) = range.split_once('-') {
            (value(a)?, value(b)?)
        } else {
            let v = value(range)?;
            // `5/15` means from 5 to the end in steps of 15.
            (v, if step > 1 { max } else { v })
        };
        if lo > hi {
            return Err(bad());
        }
        let mut v = lo;
        while v <= hi {
            set |= 1 << v;
            match v.checked_add(step) {
                Some(next) => v = next,
                None => break,
            }
        }
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn fields_and_macros_parse_or_are_refused() {
        for ok in [
            "* * * * *",
            "0 9 * * mon-fri",
            "*/15 0-6,22-23 1,15 JAN-jun 0",
            "30 2 * * 7",
            "5/20 * * * *",
            "@daily",
            "@hourly",
        ] {
            assert!(Schedule::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "* * * *",
            "* * * * * *",
            "60 * * * *",
            "* 24 * * *",
            "* * 0 * *",
            "* * * 13 *",
            "* * * * 8",
            "*/0 * * * *",
            "5-1 * * * *",
            "a * * * *",
            "@reboot",
        ] {
            assert!(Schedule::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_schedule_matches_its_minutes_in_utc() {
        let weekdays_at_nine = Schedule::parse("0 9 * * mon-fri").unwrap();
        // 2026-01-05 is a Monday.
        assert!(weekdays_at_nine.matches(t("2026-01-05T09:00:30Z")));
        assert!(!weekdays_at_nine.matches(t("2026-01-05T09:01:00Z")));
        assert!(!weekdays_at_nine.matches(t("2026-01-04T09:00:00Z")));
        let sunday = Schedule::parse("0 0 * * 7").unwrap();
        assert!(sunday.matches(t("2026-01-04T00:00:00Z")));
        // Day of month OR day of week when both are restricted.
        let either = Schedule::parse("0 0 13 * fri").unwrap();
        assert!(either.matches(t("2026-01-13T00:00:00Z")));
        assert!(either.matches(t("2026-01-09T00:00:00Z")));
        assert!(!either.matches(t("2026-01-10T00:00:00Z")));
    }

    #[test]
    fn the_last_start_is_found_within_the_bound() {
        let nine = Schedule::parse("0 9 * * *").unwrap();
        let hour = Duration::from_secs(3600);
        assert_eq!(
            nine.last_start(t("2026-01-05T09:59:59Z"), hour),
            Some(t("2026-01-05T09:00:00Z"))
        );
        assert_eq!(nine.last_start(t("2026-01-05T10:00:01Z"), hour), None);
        assert_eq!(nine.last_start(t("2026-01-05T08:59:59Z"), hour), None);
        assert_eq!(
            nine.last_start(t("2026-01-06T08:00:00Z"), 24 * hour),
            Some(t("2026-01-05T09:00:00Z"))
        );
    }
}
