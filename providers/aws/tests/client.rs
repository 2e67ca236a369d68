//! What the AWS SDK's client does for the driver that a hand-written client got wrong: every
//! throttling code EC2 and the SDK know is retried, a skewed clock is corrected, a page token
//! that repeats ends the listing, web-identity credentials are reused until they expire. Each
//! case runs against a scripted EC2 (and STS) endpoint on loopback
//! that answers as they do (Query protocol, XML bodies).

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

#[path = "common/inputs.rs"]
mod inputs;

use inputs::{REGION, scripted_spec, secret};
use mcm_api::{Machine, MachineClass};
use mcm_driver::{
    Code, Driver, GetMachineStatusRequest, ListMachinesRequest, RequestId, SecretData,
};
use mcm_provider_aws::{AwsDriver, AwsDriverConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One request as the endpoint saw it.
#[derive(Debug, Clone)]
struct Seen {
    /// The head (request line and headers), lower-cased names.
    head: String,
    /// The form body.
    body: String,
}

impl Seen {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    }
}

/// An answer: HTTP status, extra headers, XML body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

fn error_answer(status: u16, code: &str) -> Answer {
    Answer {
        status,
        headers: vec![],
        body: format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{code}</Code><Message>scripted {code}</Message></Error></Errors><RequestID>req-{code}</RequestID></Response>"
        ),
    }
}

/// A `DescribeInstances` page with `instances` (id, Name tag) and `next_token`.
fn describe_page(instances: &[(&str, &str)], next_token: Option<&str>) -> Answer {
    let items: String = instances
        .iter()
        .map(|(id, name)| {
            format!(
                "<item><instanceId>{id}</instanceId><instanceState><code>16</code><name>running</name></instanceState>\
                 <privateDnsName>ip-10-0-0-1.{REGION}.compute.internal</privateDnsName>\
                 <tagSet><item><key>Name</key><value>{name}</value></item>\
                 <item><key>kubernetes.io/cluster/x</key><value>1</value></item>\
                 <item><key>kubernetes.io/role/node</key><value>1</value></item></tagSet></item>"
            )
        })
        .collect();
    let reservations = if instances.is_empty() {
        String::new()
    } else {
        format!(
            "<item><reservationId>r-1</reservationId><instancesSet>{items}</instancesSet></item>"
        )
    };
    let token = next_token
        .map(|t| format!("<nextToken>{t}</nextToken>"))
        .unwrap_or_default();
    Answer {
        status: 200,
        headers: vec![],
        body: format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DescribeInstancesResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"><requestId>req-ok</requestId><reservationSet>{reservations}</reservationSet>{token}</DescribeInstancesResponse>"
        ),
    }
}

type Script = Arc<dyn Fn(&Seen) -> Answer + Send + Sync>;

/// A scripted EC2 endpoint on loopback: `script` answers each request; every request is kept.
async fn endpoint(script: Script) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let kept = kept.clone();
            let script = script.clone();
            tokio::spawn(async move {
                // One request per connection (the answer says `Connection: close`).
                let mut got = Vec::new();
                let mut buf = vec![0u8; 64 * 1024];
                let request = loop {
                    let n = conn.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    got.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&got).to_string();
                    if let Some((head, body)) = text.split_once("\r\n\r\n") {
                        let seen = Seen {
                            head: head.to_string(),
                            body: body.to_string(),
                        };
                        let len = seen
                            .header("content-length")
                            .and_then(|v| v.parse::<usize>().ok())
                            .unwrap_or(0);
                        if body.len() >= len {
                            break seen;
                        }
                    }
                };
                kept.lock().unwrap().push(request.clone());
                let answer = script(&request);
                let mut head = format!(
                    "HTTP/1.1 {} Scripted\r\nContent-Type: text/xml;charset=UTF-8\r\nContent-Length: {}\r\nConnection: close\r\n",
                    answer.status,
                    answer.body.len()
                );
                for (k, v) in &answer.headers {
                    head.push_str(&format!("{k}: {v}\r\n"));
                }
                head.push_str("\r\n");
                let _ = conn.write_all(head.as_bytes()).await;
                let _ = conn.write_all(answer.body.as_bytes()).await;
            });
        }
    });
    (url, seen)
}

async fn driver(url: String, max_attempts: u32) -> AwsDriver {
    AwsDriver::new(AwsDriverConfig {
        endpoint_url: Some(url),
        max_attempts: Some(max_attempts),
        operation_timeout: Duration::from_secs(60),
        ..Default::default()
    })
    .await
}

fn class() -> MachineClass {
    inputs::class(scripted_spec())
}

async fn status(d: &AwsDriver, name: &str) -> Result<(), mcm_driver::DriverError> {
    d.get_machine_status(GetMachineStatusRequest {
        machine: Machine::new(name, Default::default()),
        machine_class: class(),
        secret: secret(),
        request_id: RequestId::generate(),
    })
    .await
    .map(drop)
}

/// Every throttling code of the SDK's classifier, EC2's own among them.
const THROTTLING: &[&str] = aws_runtime::retries::classifiers::THROTTLING_ERRORS;

#[tokio::test]
async fn every_throttling_code_is_retried_though_its_status_is_400() {
    assert!(
        THROTTLING.len() >= 14 && THROTTLING.contains(&"EC2ThrottledException"),
        "{THROTTLING:?}"
    );
    // Status 400: only the code says "throttled", so a classifier that does not know the
    // code gives up after the first attempt.
    let runs = THROTTLING.iter().map(|code| async move {
        let (url, seen) = endpoint(Arc::new(move |_: &Seen| error_answer(400, code))).await;
        let d = driver(url, 3).await;
        let err = status(&d, "m").await.unwrap_err();
        let attempts = seen.lock().unwrap().len();
        (*code, attempts, err.code)
    });
    let results = futures::future::join_all(runs).await;
    let wrong: Vec<_> = results
        .iter()
        .filter(|(_, attempts, code)| *attempts != 3 || *code != Code::Unavailable)
        .collect();
    assert!(
        wrong.is_empty(),
        "(code, attempts, mapped to) that were not retried 3 times or not Unavailable: {wrong:?}"
    );
}

/// The HTTP `Date` of a clock `offset` ahead.
fn http_date(offset: Duration) -> String {
    let at = jiff::Timestamp::try_from(SystemTime::now() + offset).unwrap();
    jiff::fmt::rfc2822::DateTimePrinter::new()
        .timestamp_to_rfc9110_string(&at)
        .unwrap()
}

/// Seconds between the request's `X-Amz-Date` (`20261129T030405Z`) and now + `offset`.
fn skew_of(seen: &Seen, offset: Duration) -> i64 {
    let amz = seen.header("x-amz-date").expect("a signed request");
    let t = jiff::fmt::strtime::parse("%Y%m%dT%H%M%SZ", &amz)
        .and_then(|t| t.to_datetime())
        .and_then(|t| t.to_zoned(jiff::tz::TimeZone::UTC))
        .unwrap()
        .timestamp()
        .as_second();
    let server = (SystemTime::now() + offset)
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    server - t
}

/// An EC2 endpoint whose clock runs an hour ahead of this host's: it refuses a request signed
/// more than 5 minutes away from its time with `code`, as EC2 does, and answers an empty
/// `DescribeInstances` otherwise.
async fn skewed_endpoint(code: &'static str) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let ahead = Duration::from_secs(3600);
    endpoint(Arc::new(move |seen: &Seen| {
        let mut answer = if skew_of(seen, ahead).abs() > 300 {
            error_answer(400, code)
        } else {
            describe_page(&[], None)
        };
        answer.headers.push(("Date".into(), http_date(ahead)));
        answer
    }))
    .await
}

#[tokio::test]
async fn a_skewed_clock_is_corrected_within_the_call_that_meets_it() {
    // AuthFailure is what EC2 answers to a signature it cannot match; with a Date an hour off,
    // the SDK retries it signed with the server's time.
    let (url, seen) = skewed_endpoint("AuthFailure").await;
    let d = driver(url, 3).await;
    let err = status(&d, "skewed").await.unwrap_err();
    assert_eq!(
        err.code,
        Code::NotFound,
        "the corrected retry reads the (empty) instances: {}",
        err.full_message()
    );
    assert_eq!(seen.lock().unwrap().len(), 2, "one refused, one corrected");
}

#[tokio::test]
async fn a_skewed_clock_refused_as_expired_is_corrected_for_the_next_call() {
    let (url, seen) = skewed_endpoint("RequestExpired").await;
    let d = driver(url, 3).await;
    let first = status(&d, "expired").await.unwrap_err();
    let second = status(&d, "expired").await.unwrap_err();
    assert_eq!(
        second.code,
        Code::NotFound,
        "the next call is signed with the corrected clock: {} (first: {})",
        second.full_message(),
        first.full_message()
    );
    assert!(
        first.code == Code::NotFound || first.retry_after.is_some(),
        "a refusal for the clock is retried later, not a credentials failure: {}",
        first.full_message()
    );
    let skews: Vec<i64> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|s| skew_of(s, Duration::from_secs(3600)))
        .collect();
    assert!(
        skews.last().is_some_and(|s| s.abs() <= 300),
        "the last request is signed with the server's time: {skews:?}"
    );
}

#[tokio::test]
async fn a_page_token_that_repeats_ends_the_listing() {
    // An endpoint that answers every page with the same next token: the listing must end.
    let (url, seen) = endpoint(Arc::new(|_: &Seen| {
        describe_page(&[("i-0000000000000001", "m-1")], Some("same-token"))
    }))
    .await;
    let d = driver(url, 1).await;
    let listed = tokio::time::timeout(
        Duration::from_secs(20),
        d.list_machines(ListMachinesRequest {
            machine_class: class(),
            secret: secret(),
            request_id: RequestId::generate(),
        }),
    )
    .await;
    let pages = seen.lock().unwrap().len();
    let listed = listed.unwrap_or_else(|_| panic!("the listing did not end: {pages} pages read"));
    let listed = listed.unwrap();
    assert_eq!(listed.machines.len(), 1, "{listed:?}");
    assert!(pages <= 3, "{pages} pages for one repeated token");
    assert!(
        seen.lock().unwrap()[1..]
            .iter()
            .all(|s| s.body.contains("NextToken=same-token")),
        "pages after the first ask for the token"
    );
}

/// STS's answer to `AssumeRoleWithWebIdentity`: credentials that expire `lifetime` from now.
fn assumed_role(lifetime: Duration) -> Answer {
    let expiry = jiff::Timestamp::try_from(SystemTime::now() + lifetime).unwrap();
    Answer {
        status: 200,
        headers: vec![],
        body: format!(
            "<AssumeRoleWithWebIdentityResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\">\
             <AssumeRoleWithWebIdentityResult><Credentials><AccessKeyId>ASIASCRIPTED</AccessKeyId>\
             <SecretAccessKey>scripted-secret</SecretAccessKey><SessionToken>scripted-token</SessionToken>\
             <Expiration>{}</Expiration></Credentials>\
             <AssumedRoleUser><Arn>arn:aws:sts::123456789012:assumed-role/mcm/s</Arn><AssumedRoleId>AROA:s</AssumedRoleId></AssumedRoleUser>\
             </AssumeRoleWithWebIdentityResult><ResponseMetadata><RequestId>sts-1</RequestId></ResponseMetadata>\
             </AssumeRoleWithWebIdentityResponse>",
            expiry.strftime("%Y-%m-%dT%H:%M:%SZ")
        ),
    }
}

/// The web-identity tokens STS was asked to exchange, in order.
fn exchanged_tokens(seen: &[Seen]) -> Vec<String> {
    seen.iter()
        .filter(|s| s.body.contains("Action=AssumeRoleWithWebIdentity"))
        .filter_map(|s| {
            s.body
                .split('&')
                .find_map(|kv| kv.strip_prefix("WebIdentityToken=").map(String::from))
        })
        .collect()
}

#[tokio::test]
async fn web_identity_credentials_serve_every_call_until_they_expire_and_the_token_file_is_read_again()
 {
    for (lifetime, exchanges) in [(Duration::from_secs(3600), 1), (Duration::from_secs(5), 3)] {
        let (url, seen) = endpoint(Arc::new(move |s: &Seen| {
            if s.body.contains("Action=AssumeRoleWithWebIdentity") {
                assumed_role(lifetime)
            } else {
                describe_page(&[], None)
            }
        }))
        .await;
        let d = driver(url, 1).await;
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("token");
        let secret = SecretData::from_pairs([
            ("roleARN", "arn:aws:iam::123456789012:role/mcm"),
            ("workloadIdentityTokenFile", token_file.to_str().unwrap()),
        ]);
        for i in 1..=3 {
            std::fs::write(&token_file, format!("token-{i}")).unwrap();
            let err = d
                .get_machine_status(GetMachineStatusRequest {
                    machine: Machine::new("wi", Default::default()),
                    machine_class: class(),
                    secret: secret.clone(),
                    request_id: RequestId::generate(),
                })
                .await
                .unwrap_err();
            assert_eq!(err.code, Code::NotFound, "{}", err.full_message());
        }
        let seen = seen.lock().unwrap().clone();
        let tokens = exchanged_tokens(&seen);
        assert_eq!(
            tokens.len(),
            exchanges,
            "credentials living {lifetime:?}: exchanges {tokens:?}"
        );
        if exchanges == 3 {
            assert_eq!(
                tokens,
                ["token-1", "token-2", "token-3"],
                "each exchange reads the file again"
            );
        }
        let signed_with_session = seen
            .iter()
            .filter(|s| s.body.contains("Action=DescribeInstances"))
            .all(|s| s.header("x-amz-security-token").as_deref() == Some("scripted-token"));
        assert!(signed_with_session, "EC2 requests carry the role's session");
    }
}
