//! `hami.io/vgpu-devices-{to-allocate,allocated}`: per container
//! `uuid,type,mem,cores:` entries separated by `;`. Either refused with an
//! error, or it encodes to text that decodes to the same devices.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::hami::pod_devices::PodDevices;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(devices) = text.parse::<PodDevices>() {
        let _ = devices.first_pending();
        let _ = devices.devices().count();
        if let Some(i) = devices.first_pending_index() {
            let _ = devices.erase_container(i);
        }
        if let Ok(encoded) = devices.try_encode() {
            let again: PodDevices = encoded.parse().expect("encoded devices parse");
            assert_eq!(devices, again, "round trip through {encoded}");
        }
    }
});
