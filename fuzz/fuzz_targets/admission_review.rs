//! `POST /webhook` bodies from kube-apiserver: any bytes get an answer or a
//! `BadReview` (HTTP 400), never a panic; an answer is an AdmissionReview
//! with the request's uid. Both modes: device-plugin and DRA.
#![no_main]

use libfuzzer_sys::fuzz_target;
use scheduler_webhook::settings::Mode;
use scheduler_webhook::webhook::WebhookConfig;
use scheduler_webhook::webhook::review::answer;

fuzz_target!(|data: &[u8]| {
    for mode in Mode::ALL {
        let config = WebhookConfig {
            mode,
            ..WebhookConfig::default()
        };
        if let Ok(review) = answer(data, &config) {
            assert_eq!(review["kind"], "AdmissionReview");
            assert!(review["response"]["uid"].is_string(), "{review}");
            assert!(review["response"]["allowed"].is_boolean(), "{review}");
        }
    }
});
