//! Unit tests of the pure parts: the query, the filter re-check, backoff, redaction.

use std::time::Duration;

use hive_api::provider::OfferFilter;
use serde_json::json;

use super::*;

fn client(key: &str) -> VastClient {
    let mut config = VastConfig::new(ApiKey::new(key).unwrap());
    config.base_url = "http://127.0.0.1:9/api/v0".into();
    VastClient::new(config).unwrap()
}

#[test]
fn the_query_names_every_set_filter() {
    let filter = OfferFilter {
        gpu_name: Some("RTX 4090".into()),
        num_gpus: Some(2),
        min_gpu_ram_gb: Some(24),
        max_dollars_per_hour: Some(0.5),
        min_reliability: Some(0.98),
        verified: Some(true),
        geolocation: vec!["US".into(), "DE".into()],
    };
    assert_eq!(
        offer_query(&filter, 100),
        json!({
            "rentable": {"eq": true}, "rented": {"eq": false}, "external": {"eq": false},
            "gpu_name": {"eq": "RTX 4090"}, "num_gpus": {"eq": 2}, "gpu_ram": {"gte": 24000},
            "dph_total": {"lte": 0.5}, "reliability": {"gte": 0.98}, "verified": {"eq": true},
            "geolocation": {"in": ["US", "DE"]},
            "order": [["dph_total", "asc"]], "limit": 100, "type": "on-demand"
        })
    );
    assert_eq!(
        offer_query(&OfferFilter::default(), 5),
        json!({"rentable": {"eq": true}, "rented": {"eq": false}, "external": {"eq": false},
               "order": [["dph_total", "asc"]], "limit": 5, "type": "on-demand"})
    );
}

#[test]
fn offers_are_rechecked_against_the_filter() {
    let offer = Offer::from_json(&json!({
        "id": 7, "gpu_name": "RTX 4090", "num_gpus": 1, "gpu_ram": 24564, "dph_total": 0.4,
        "reliability2": 0.99, "verification": "verified", "geolocation": "Austin, US"
    }))
    .unwrap();
    assert_eq!(offer.country(), Some("US"));
    let base = OfferFilter { gpu_name: Some("rtx 4090".into()), ..Default::default() };
    assert!(offer_matches(&base, &offer));
    let with = |f: fn(&mut OfferFilter)| {
        let mut filter = base.clone();
        f(&mut filter);
        offer_matches(&filter, &offer)
    };
    assert!(with(|f| f.min_gpu_ram_gb = Some(24)));
    assert!(!with(|f| f.min_gpu_ram_gb = Some(25)));
    assert!(!with(|f| f.max_dollars_per_hour = Some(0.3)));
    assert!(!with(|f| f.num_gpus = Some(2)));
    assert!(!with(|f| f.min_reliability = Some(0.995)));
    assert!(with(|f| f.verified = Some(true)));
    assert!(!with(|f| f.geolocation = vec!["DE".into()]));
    assert!(!with(|f| f.gpu_name = Some("H100 SXM".into())));
    let rented = Offer { rented: true, ..offer.clone() };
    assert!(!offer_matches(&base, &rented));
    assert!(Offer::from_json(&json!({"gpu_name": "x"})).is_none(), "an offer needs an id");
}

#[test]
fn backoff_doubles_caps_jitters_and_honours_retry_after() {
    let policy = RetryPolicy {
        max_attempts: 5,
        base_delay: Duration::from_millis(100),
        max_delay: Duration::from_millis(1000),
        max_retry_after: Duration::from_secs(60),
    };
    assert_eq!(backoff_delay(&policy, 1, None, 0.0), Duration::from_millis(50));
    assert_eq!(backoff_delay(&policy, 1, None, 1.0), Duration::from_millis(100));
    assert_eq!(backoff_delay(&policy, 3, None, 1.0), Duration::from_millis(400));
    assert_eq!(backoff_delay(&policy, 9, None, 1.0), Duration::from_millis(1000));
    assert_eq!(backoff_delay(&policy, 40, None, 0.5), Duration::from_millis(750));
    assert_eq!(backoff_delay(&policy, 2, Some(Duration::from_secs(7)), 0.3), Duration::from_secs(7));
    assert_eq!(parse_retry_after(" 3 "), Some(Duration::from_secs(3)));
    assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT"), Some(Duration::ZERO));
    assert_eq!(parse_retry_after("soon"), None);
    let j = jitter();
    assert!((0.0..=1.0).contains(&j));
}

#[test]
fn the_key_is_never_shown() {
    let key = "sk-very-secret-0123456789";
    let c = client(key);
    let debug = format!("{c:?} {:?}", ApiKey::new(key).unwrap());
    assert!(!debug.contains(key), "{debug}");
    assert!(debug.contains(REDACTED));
    let text = c.redact(&format!("bad key {key} at https://x/api/v0/?api_key={key}&q=1 and api_key=other"));
    assert!(!text.contains(key) && !text.contains("other"), "{text}");
    assert_eq!(text, "bad key [redacted] at https://x/api/v0/?api_key=[redacted]&q=1 and api_key=[redacted]");
    // Case and encoding variants, as a careless server may echo them.
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(format!("me:{key}"));
    let text =
        c.redact(&format!("{} {} Basic {b64}", key.to_uppercase(), serde_json::to_string(key).unwrap()));
    assert!(!text.to_lowercase().contains(key), "{text}");
    assert!(!text.contains(&b64[4..20]), "{text}");
    assert_eq!(c.redact("API_KEY=abc&x=1"), "API_KEY=[redacted]&x=1");
    assert!(ApiKey::new("  ").is_err());
    assert!(ApiKey::new("k".repeat(MAX_KEY_LEN + 1)).is_err());
    let err = ApiKey::new("has space").unwrap_err();
    assert!(!err.contains("has space"), "{err}");
}

#[test]
fn labels_and_create_limits() {
    assert_eq!(instance_label("c1", "node-3"), "hive:c1:node-3");
    let ok = CreateRequest::new(5, instance_label("c1", "node-3"), "img:1", Some("echo hi".into()));
    ok.check().unwrap();
    assert_eq!(
        ok.body(),
        json!({"client_id": "me", "image": "img:1", "label": "hive:c1:node-3", "disk": DEFAULT_DISK_GB,
               "runtype": "ssh", "env": {}, "onstart": "echo hi"})
    );
    let long = CreateRequest { label: "x".repeat(MAX_LABEL + 1), ..ok.clone() };
    assert!(matches!(long.check(), Err(VastError::Invalid(_))));
    let small = CreateRequest { disk_gb: 4, ..ok };
    assert!(small.check().is_err());
}

#[test]
fn base_urls() {
    let c = client("k");
    assert_eq!(c.v1, "http://127.0.0.1:9/api/v1");
    let mut config = VastConfig::new(ApiKey::new("k").unwrap());
    config.base_url = "http://h/api/v0/?api_key=k".into();
    assert!(matches!(VastClient::new(config), Err(VastError::Config(_))));
    let mut config = VastConfig::new(ApiKey::new("k").unwrap());
    config.base_url = "ftp://h".into();
    assert!(VastClient::new(config).is_err());
}

#[tokio::test(start_paused = true)]
async fn a_refused_connection_is_retried_with_backoff_then_reported() {
    // A port nothing listens on refuses: nothing is ever sent.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut config = VastConfig::new(ApiKey::new("k").unwrap());
    config.base_url = format!("http://127.0.0.1:{port}/api/v0");
    config.retry = RetryPolicy { max_attempts: 3, ..RetryPolicy::default() };
    let c = VastClient::new(config).unwrap();
    let start = tokio::time::Instant::now();
    let err = c.show(InstanceId(1)).await.unwrap_err();
    assert!(matches!(err, VastError::Transport { what: "show", .. }), "{err}");
    // Two backoffs of at least base/2 and base: 0.5 s + 1 s, in paused time.
    assert!(start.elapsed() >= Duration::from_millis(1500), "{:?}", start.elapsed());
}
