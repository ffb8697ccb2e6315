//! `POST /bind` bodies (`ExtenderBindingArgs`) from kube-scheduler: decoded
//! or refused with a `BadRequest` (HTTP 400), never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use scheduler_webhook::extender::wire::decode_bind;

fuzz_target!(|data: &[u8]| {
    let _ = decode_bind(data);
});
