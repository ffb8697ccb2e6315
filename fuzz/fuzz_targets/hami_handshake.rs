//! `hami.io/node-handshake`: `Requesting_<t>`, `Deleted_<t>`, `Reported <t>`.
//! Either refused with an error, or its text decodes to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::hami::handshake::{Handshake, ReportedTime};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(reported) = text.parse::<ReportedTime>() {
        let _ = reported.to_unix_seconds();
    }
    if let Ok(value) = text.parse::<Handshake>() {
        let _ = value.age_seconds(i64::MAX);
        let _ = value.is_fresh_request(i64::MIN);
        let shown = value.to_string();
        let again: Handshake = shown.parse().expect("a shown handshake parses");
        assert_eq!(value, again, "round trip through {shown}");
    }
});
