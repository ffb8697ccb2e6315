//! `POST /webhook` bodies from kube-apiserver: any bytes get an answer or a
//! `BadReview` (HTTP 400), never a panic; an answer is an AdmissionReview
//! with the request's uid.
#![no_main]

use libfuzzer_sys::fuzz_target;
use scheduler_webhook::webhook::WebhookConfig;
use scheduler_webhook::webhook::review::answer;

fuzz_target!(|data: &[u8]| {
    if let Ok(review) = answer(data, &WebhookConfig::default()) {
        assert_eq!(review["kind"], "AdmissionReview");
        assert!(review["response"]["uid"].is_string(), "{review}");
        assert!(review["response"]["allowed"].is_boolean(), "{review}");
    }
});
