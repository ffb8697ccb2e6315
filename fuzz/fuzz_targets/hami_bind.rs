//! `hami.io/bind-phase` and `hami.io/bind-time` (`vgpu-time`): either
//! refused with an error, or the text decodes to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::hami::bind::{BindPhase, BindTime};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(phase) = text.parse::<BindPhase>() {
        assert_eq!(phase.as_str().parse::<BindPhase>(), Ok(phase));
    }
    if let Ok(time) = text.parse::<BindTime>() {
        let _ = time.age_seconds(i64::MIN);
        let _ = time.is_older_than(i64::MAX, i64::MIN);
        assert_eq!(time.to_string().parse::<BindTime>(), Ok(time));
        let _ = BindTime::from_unix_seconds(time.as_unix_seconds());
    }
});
