//! The date-time layouts HAMi values carry (`2006-01-02 15:04:05`,
//! `2006.01.02 15:04:05`, RFC 3339): either refused with an error, or the
//! time shows as text that parses to the same time.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::hami::civil_time::CivilDateTime;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for parsed in [
        CivilDateTime::parse_date_time(text),
        CivilDateTime::parse_dotted(text),
        CivilDateTime::parse_rfc3339(text),
    ]
    .into_iter()
    .flatten()
    {
        let shown = parsed.to_string();
        assert_eq!(shown.parse::<CivilDateTime>(), Ok(parsed), "{shown}");
        let rfc = parsed.to_rfc3339_utc();
        assert_eq!(CivilDateTime::parse_rfc3339(&rfc), Ok(parsed), "{rfc}");
        assert_eq!(
            CivilDateTime::from_unix_seconds(parsed.to_unix_seconds()),
            Ok(parsed)
        );
    }
});
