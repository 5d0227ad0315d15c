//! A job's webhook (`notify_url`): its end, POSTed as the JSON of its event, signed so the
//! receiver can tell it came from the fleet. Sent on a task of its own, retried with
//! backoff for about a minute, never in the job's way: a receiver that is down delays
//! nothing and fails nothing.
//!
//! The signature is `X-Fleetrun-Signature: sha256=<hex>`, the HMAC-SHA256 of the exact body
//! with the secret in `FLEETRUN_WEBHOOK_SECRET` of the process that ends the job (give every
//! worker, submitter and `fleetrun serve` the same one). Without it the POST goes unsigned.

use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use fleetrun_common::events::JobEvent;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tracing::{info, warn};

/// The variable that holds the webhooks' signing secret.
pub const SECRET_VAR: &str = "FLEETRUN_WEBHOOK_SECRET";
/// The header that carries the signature.
pub const SIGNATURE_HEADER: &str = "X-Fleetrun-Signature";
/// The header that carries the event's routing key (`job.completed`, …).
pub const EVENT_HEADER: &str = "X-Fleetrun-Event";

/// How long one POST may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Sends `event` to `url` in the background.
pub fn send(url: &str, event: &JobEvent) {
    let (url, event) = (url.to_owned(), event.clone());
    let secret = std::env::var(SECRET_VAR).ok().filter(|s| !s.is_empty());
    tokio::spawn(async move {
        let body = event.to_json();
        let signature = secret
            .as_deref()
            .map(|secret| sign(secret.as_bytes(), &body));
        let client = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .expect("an HTTP client with a timeout");
        let post = || async {
            let mut request = client
                .post(&url)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .header(EVENT_HEADER, event.routing_key())
                .body(body.clone());
            if let Some(signature) = &signature {
                request = request.header(SIGNATURE_HEADER, signature);
            }
            request.send().await?.error_for_status().map(drop)
        };
        let backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(500))
            .with_max_delay(Duration::from_secs(20))
            .with_max_times(6)
            .with_jitter();
        match post.retry(backoff).await {
            Ok(()) => info!(job = %event.job_id, state = %event.state, "Webhook delivered."),
            // reqwest's errors name the URL, which may carry a token: say the host only.
            Err(e) => {
                warn!(job = %event.job_id, state = %event.state, error = %e.without_url(), "Webhook not delivered; giving up.")
            }
        }
    });
}

/// `sha256=<hex HMAC-SHA256 of body>`.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

#[cfg(test)]
mod tests {
    /// RFC 4231 test case 2.
    #[test]
    fn signatures_are_hmac_sha256() {
        assert_eq!(
            super::sign(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
