//! `hami.io/mutex.lock`: `<time>[,<namespace>,<pod>]`. Either refused with
//! an error, or its text decodes to the same lock.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::hami::node_lock::NodeLock;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(lock) = text.parse::<NodeLock>() {
        let _ = lock.is_expired(i64::MAX, i64::MAX);
        let _ = lock.is_expired(i64::MIN, 300);
        let _ = lock.may_be_released_by("ns", "pod");
        let shown = lock.to_string();
        let again: NodeLock = shown.parse().expect("a shown lock parses");
        assert_eq!(lock, again, "round trip through {shown}");
    }
});
