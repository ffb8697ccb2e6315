//! `hami.io/node-nvidia-register`: the node's device list, written by a
//! node-daemon (or HAMi's device plugin) and read by the scheduler. Either
//! it is refused with an error, or it re-encodes to JSON that decodes to
//! the same devices.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::hami::register;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = register::decode_legacy(text);
    let _ = register::decode_json(text);
    let _ = register::parse_go_bool(text);
    if let Ok(devices) = register::decode(text) {
        let json = register::encode_json(&devices).expect("decoded devices encode");
        let again = register::decode_json(&json).expect("encoded devices decode");
        assert_eq!(devices, again, "round trip through {json}");
    }
});
