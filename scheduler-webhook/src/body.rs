//! The request body of every `POST` route: at most the route's
//! `PayloadConfig` limit (413, as actix-web's `Bytes` extractor), and all
//! of it within [`BODY_TIMEOUT`] (408).
//!
//! actix-web times out only the request head (5 s); a client that sends a
//! head and then trickles or stops its body would hold its connection and
//! up to one body of memory for ever. kube-apiserver and kube-scheduler
//! send the whole body at once and give up on a call long before this
//! timeout.

use std::time::Duration;

use actix_web::dev::Payload;
use actix_web::{FromRequest, HttpRequest, web};
use futures::future::LocalBoxFuture;

/// Longest a client may take to send a request body.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// A whole request body, received in time.
#[derive(Debug, Clone)]
pub struct Body(pub web::Bytes);

impl std::ops::Deref for Body {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl FromRequest for Body {
    type Error = actix_web::Error;
    type Future = LocalBoxFuture<'static, Result<Self, Self::Error>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let bytes = web::Bytes::from_request(req, payload);
        Box::pin(async move {
            match tokio::time::timeout(BODY_TIMEOUT, bytes).await {
                Ok(bytes) => bytes.map(Body),
                Err(_) => Err(actix_web::error::ErrorRequestTimeout(format!(
                    "request body not received within {} s",
                    BODY_TIMEOUT.as_secs()
                ))),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use actix_web::http::StatusCode;
    use actix_web::test::TestRequest;

    use super::*;

    #[actix_web::test]
    async fn a_body_that_stops_arriving_is_408_after_the_timeout() {
        tokio::time::pause();
        let req = TestRequest::post()
            .insert_header(("content-length", "100"))
            .to_http_request();
        let never: std::pin::Pin<
            Box<dyn futures::Stream<Item = Result<web::Bytes, actix_web::error::PayloadError>>>,
        > = Box::pin(futures::stream::pending());
        let mut stalled = Payload::Stream { payload: never };
        let started = tokio::time::Instant::now();
        let error = Body::from_request(&req, &mut stalled).await.unwrap_err();
        assert_eq!(
            error.as_response_error().status_code(),
            StatusCode::REQUEST_TIMEOUT
        );
        assert!(started.elapsed() >= BODY_TIMEOUT);
    }

    #[actix_web::test]
    async fn a_whole_body_is_read() {
        let (req, mut payload) = TestRequest::post().set_payload("{}").to_http_parts();
        let body = Body::from_request(&req, &mut payload).await.unwrap();
        assert_eq!(&*body, b"{}");
    }
}
