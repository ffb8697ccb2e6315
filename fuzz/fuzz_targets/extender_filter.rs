//! `POST /filter` bodies (`ExtenderArgs`) from kube-scheduler: decoded or
//! refused with a `BadRequest` (HTTP 400), never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use scheduler_webhook::extender::wire::decode_filter;

fuzz_target!(|data: &[u8]| {
    if let Ok(args) = decode_filter(data) {
        let count = args.candidates().len();
        let (_pod, names) = args.into_parts();
        assert_eq!(names.len(), count);
    }
});
