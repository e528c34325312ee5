//! Datetimes as the time-parsing model writes them, turned into the facility's zone: RFC 3339
//! with an offset or `Z` (converted), naive `YYYY-MM-DD HH:MM[:SS]` (read as local time, the
//! earlier instant when the clock falls back, an error when it springs forward over it), and
//! the validation of a parsed range (§5.3, §8.2 case 22).

use chrono::{DateTime, Datelike, FixedOffset, LocalResult, NaiveDateTime, TimeZone, Utc};
use chrono_tz::Tz;
use peregrine_core::ErrorClassification;

use super::{TimeRangeContext, TimeRangeOutput};

/// Why a parsed time range cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TimeRangeError {
    /// The model found no time reference in the query.
    #[error("no time range found in '{query}'")]
    NotFound {
        /// The step objective that was parsed.
        query: String,
    },
    /// A datetime the model wrote is not one.
    #[error("{field} '{text}' is not a datetime ({reason}); expected 'YYYY-MM-DD HH:MM:SS' or RFC 3339 with an offset")]
    Unparseable {
        /// `start_date` or `end_date`.
        field: &'static str,
        /// What the model wrote.
        text: String,
        /// What the parser said.
        reason: String,
    },
    /// A local time skipped by a daylight-saving change.
    #[error("{field} '{text}' does not exist in {timezone}: the clocks skip it at the daylight-saving change")]
    NonexistentLocalTime {
        /// `start_date` or `end_date`.
        field: &'static str,
        /// What the model wrote.
        text: String,
        /// The facility's zone.
        timezone: String,
    },
    /// The range is empty or reversed.
    #[error("start_date ({start}) must be before end_date ({end})")]
    StartNotBeforeEnd {
        /// The parsed start.
        start: String,
        /// The parsed end.
        end: String,
    },
    /// A date in a year that has not begun (a typical model slip).
    #[error("the range reaches into {year}, after the current year {current_year}")]
    FutureYear {
        /// The offending year.
        year: i32,
        /// The current year in the facility's zone.
        current_year: i32,
    },
}

impl TimeRangeError {
    /// REPLANNING when the query has no time reference; RETRIABLE when the model's answer was
    /// malformed (another attempt usually fixes it).
    pub fn classification(&self) -> ErrorClassification {
        let classification = match self {
            Self::NotFound { .. } => {
                ErrorClassification::replanning("Unable to identify a time reference in the query; please clarify the time period")
                    .with_metadata("replanning_reason", "ambiguous time reference")
            }
            _ => ErrorClassification::retriable(format!("Invalid time range from the time parser: {self}")),
        };
        classification.with_metadata("technical_details", self.to_string())
    }
}

/// The naive forms accepted, most specific first (`%.f` also accepts no fraction).
const NAIVE_FORMATS: [&str; 4] = ["%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M"];

/// Forms with a numeric offset that RFC 3339 parsing does not take.
const OFFSET_FORMATS: [&str; 6] = [
    "%Y-%m-%d %H:%M:%S%.f%:z",
    "%Y-%m-%d %H:%M:%S%.f%z",
    "%Y-%m-%dT%H:%M:%S%.f%z",
    "%Y-%m-%d %H:%M:%S%.f %:z",
    "%Y-%m-%dT%H:%M%:z",
    "%Y-%m-%d %H:%M%:z",
];

/// Parses one datetime into the facility's zone `timezone`.
pub fn parse_datetime(text: &str, timezone: Tz) -> Result<DateTime<Tz>, TimeRangeError> {
    parse_field("datetime", text, timezone)
}

pub(crate) fn parse_field(field: &'static str, text: &str, timezone: Tz) -> Result<DateTime<Tz>, TimeRangeError> {
    let trimmed = text.trim();
    let unparseable = |reason: &str| TimeRangeError::Unparseable { field, text: text.to_owned(), reason: reason.to_owned() };
    if trimmed.is_empty() {
        return Err(unparseable("empty"));
    }
    if let Some(with_offset) = parse_with_offset(trimmed) {
        return Ok(with_offset.with_timezone(&timezone));
    }
    if let Some(utc_part) = strip_utc_suffix(trimmed) {
        let naive = parse_naive(utc_part).ok_or_else(|| unparseable("unknown format before the UTC marker"))?;
        return Ok(Utc.from_utc_datetime(&naive).with_timezone(&timezone));
    }
    let naive = parse_naive(trimmed).ok_or_else(|| unparseable("unknown format"))?;
    match timezone.from_local_datetime(&naive) {
        LocalResult::Single(local) => Ok(local),
        // Clocks fall back: the hour happens twice; the earlier reading is the usual intent.
        LocalResult::Ambiguous(earliest, _) => Ok(earliest),
        LocalResult::None => {
            Err(TimeRangeError::NonexistentLocalTime { field, text: text.to_owned(), timezone: timezone.name().to_owned() })
        }
    }
}

fn parse_with_offset(text: &str) -> Option<DateTime<FixedOffset>> {
    DateTime::parse_from_rfc3339(text).ok().or_else(|| OFFSET_FORMATS.iter().find_map(|format| DateTime::parse_from_str(text, format).ok()))
}

fn parse_naive(text: &str) -> Option<NaiveDateTime> {
    NAIVE_FORMATS.iter().find_map(|format| NaiveDateTime::parse_from_str(text, format).ok())
}

/// `…Z`, `… UTC` or `… GMT` without a numeric offset: the part before the marker.
fn strip_utc_suffix(text: &str) -> Option<&str> {
    for marker in ["UTC", "GMT", "Z"] {
        if text.len() > marker.len() && text.is_char_boundary(text.len() - marker.len()) {
            let (head, tail) = text.split_at(text.len() - marker.len());
            if tail.eq_ignore_ascii_case(marker) {
                return Some(head.trim_end());
            }
        }
    }
    None
}

/// Checks the model's answer and builds the context: found, both datetimes parse, start before
/// end, no year after the current one (`now` is in the facility's zone).
pub(crate) fn validate(output: &TimeRangeOutput, query: &str, now: &DateTime<Tz>) -> Result<TimeRangeContext, TimeRangeError> {
    if !output.found {
        return Err(TimeRangeError::NotFound { query: query.to_owned() });
    }
    let timezone = now.timezone();
    let start = parse_field("start_date", &output.start_date, timezone)?;
    let end = parse_field("end_date", &output.end_date, timezone)?;
    if start >= end {
        return Err(TimeRangeError::StartNotBeforeEnd { start: start.to_rfc3339(), end: end.to_rfc3339() });
    }
    let current_year = now.year();
    if let Some(year) = [start.year(), end.year()].into_iter().find(|year| *year > current_year) {
        return Err(TimeRangeError::FutureYear { year, current_year });
    }
    Ok(TimeRangeContext::new(start, end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono_tz::America::Los_Angeles;

    fn rfc(text: &str) -> String {
        parse_datetime(text, Los_Angeles).expect("parses").to_rfc3339()
    }

    #[test]
    fn accepted_forms_end_in_the_facility_zone() {
        let table = [
            ("2025-03-10 10:00:00", "2025-03-10T10:00:00-07:00"),
            ("2025-03-10T10:00:00", "2025-03-10T10:00:00-07:00"),
            ("2025-03-10 10:00", "2025-03-10T10:00:00-07:00"),
            ("  2025-03-10 10:00:00.250 ", "2025-03-10T10:00:00.250-07:00"),
            ("2025-03-10T17:00:00Z", "2025-03-10T10:00:00-07:00"),
            ("2025-03-10 17:00:00 UTC", "2025-03-10T10:00:00-07:00"),
            ("2025-03-10 17:00 utc", "2025-03-10T10:00:00-07:00"),
            ("2025-03-10T12:00:00-05:00", "2025-03-10T10:00:00-07:00"),
            ("2025-03-10 12:00:00-05:00", "2025-03-10T10:00:00-07:00"),
            ("2025-03-10T12:00:00-0500", "2025-03-10T10:00:00-07:00"),
            ("2025-01-15 09:00:00", "2025-01-15T09:00:00-08:00"),
        ];
        for (input, expected) in table {
            assert_eq!(rfc(input), expected, "input {input:?}");
        }
    }

    #[test]
    fn daylight_saving_edges_are_explicit() {
        // Fall back: 01:30 happens twice; the earlier (PDT) reading is taken.
        assert_eq!(rfc("2025-11-02 01:30:00"), "2025-11-02T01:30:00-07:00");
        // Spring forward: 02:30 never happens.
        let error = parse_field("start_date", "2025-03-09 02:30:00", Los_Angeles).expect_err("skipped hour");
        assert!(matches!(error, TimeRangeError::NonexistentLocalTime { field: "start_date", .. }));
        assert!(error.to_string().contains("America/Los_Angeles"));
    }

    #[test]
    fn garbage_is_reported_with_the_text() {
        for input in ["", "yesterday", "2025-13-01 00:00:00", "2025-03-10", "10:00 UTC"] {
            let error = parse_field("end_date", input, Los_Angeles).expect_err(input);
            assert!(matches!(error, TimeRangeError::Unparseable { field: "end_date", .. }), "{input:?}: {error:?}");
            assert!(error.to_string().contains(&format!("'{input}'")));
        }
    }

    #[test]
    fn classification_follows_the_callers_next_action() {
        let severity = |error: TimeRangeError| error.classification().severity;
        use peregrine_core::ErrorSeverity::{Replanning, Retriable};
        assert_eq!(severity(TimeRangeError::NotFound { query: "q".into() }), Replanning);
        assert_eq!(severity(TimeRangeError::StartNotBeforeEnd { start: "a".into(), end: "b".into() }), Retriable);
        assert_eq!(severity(TimeRangeError::FutureYear { year: 2030, current_year: 2025 }), Retriable);
        assert_eq!(
            severity(TimeRangeError::NonexistentLocalTime { field: "start_date", text: "x".into(), timezone: "UTC".into() }),
            Retriable
        );
    }
}
