//! The operator page of `fleetrun serve` in a real headless browser: Debian's chromium,
//! driven through its chromedriver (WebDriver) by fantoccini, against a fleet on the real
//! servers. A machine without them fails this test: scripts/install-deps.sh installs them.

use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::time::Instant;

use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};

use super::*;

/// How long the page may take to show what the fleet did.
const PAGE_LIMIT: Duration = Duration::from_secs(90);

/// chromedriver on a free loopback port, leading a process group that the browsers it
/// starts join; the whole group is killed when this is dropped, on every way out of the
/// test.
struct ChromeDriver {
    child: Child,
    url: String,
    /// The browser's profile, of this test alone.
    profile: tempfile::TempDir,
}

impl ChromeDriver {
    fn start(log: &Path) -> ChromeDriver {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let log = std::fs::File::create(log).unwrap();
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .process_group(0)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "chromedriver does not start ({e}): Debian's chromium and chromium-driver are needed (scripts/install-deps.sh)"
                )
            });
        let driver = ChromeDriver {
            child,
            url: format!("http://127.0.0.1:{port}"),
            profile: tempfile::tempdir().unwrap(),
        };
        wait_for("chromedriver to listen", Duration::from_secs(30), || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        driver
    }

    /// A headless chromium session.
    async fn browser(&self) -> Client {
        let options = json!({
            "binary": "/usr/bin/chromium",
            "args": [
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                format!("--user-data-dir={}", self.profile.path().display()),
            ],
        });
        let capabilities = serde_json::Map::from_iter([("goog:chromeOptions".to_owned(), options)]);
        ClientBuilder::new(HttpConnector::new())
            .capabilities(capabilities)
            .connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("no chromium session through chromedriver: {e}"))
    }
}

impl Drop for ChromeDriver {
    fn drop(&mut self) {
        // SAFETY: kill(2) of the process group our own child leads.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// What `script` answers in the page once `done` holds of it, asked every 100 ms for at most
/// [`PAGE_LIMIT`]; past it the test fails with the last answer and the page's text.
async fn page_shows(
    page: &Client,
    what: &str,
    script: &str,
    args: Vec<Value>,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + PAGE_LIMIT;
    loop {
        let answer = page.execute(script, args.clone()).await.unwrap();
        if done(&answer) {
            return answer;
        }
        if Instant::now() >= deadline {
            let text = page
                .execute("return document.body.innerText;", vec![])
                .await
                .unwrap_or_default();
            panic!(
                "the page did not show {what} in {PAGE_LIMIT:?}: last {answer}\n--- page\n{text}"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A job's row in the page's table of jobs, by the class of each cell, or `null`.
const JOB_ROW: &str = r##"
const row = document.querySelector(`#jobs tr[data-job="${CSS.escape(arguments[0])}"]`);
if (!row) return null;
const cells = {};
for (const name of ["state", "progress", "items", "rate", "eta", "failures", "output"]) {
  cells[name] = row.querySelector("." + name).textContent;
}
return cells;
"##;

/// The page's mini-batches in flight: each row's first item, and how many elements the
/// table holds besides its own (markup from a job would make some).
const IN_FLIGHT: &str = r##"
const table = document.querySelector("#in-flight");
const section = document.querySelector("#job");
return {
  shown: !section.hidden,
  job: document.querySelector("#job-id").textContent,
  first_items: [...table.querySelectorAll("tbody .first-item")].map((td) => td.textContent),
  foreign: table.querySelectorAll("tbody b, tbody img, tbody script").length,
};
"##;

/// A script that returns each item's name; items whose name has `hold` wait for the gate
/// file (at most two minutes), and those whose name starts with `bad` fail (left out of
/// the result).
fn gated_script(gate: &Path) -> String {
    format!(
        r#"import os, time
GATE = {gate:?}
def run(mini_batch):
    out = []
    for p in mini_batch:
        name = os.path.basename(p)
        if name.startswith("bad"):
            continue
        if "hold" in name:
            deadline = time.time() + 120
            while not os.path.exists(GATE) and time.time() < deadline:
                time.sleep(0.05)
        out.append(name)
    return out
"#,
        gate = gate.display().to_string()
    )
}

/// The page shows a running job with its progress and the mini-batches in flight (their
/// first items, with markup in their names shown as text), then its end, Completed, and a
/// failed job's cause; it asks for the API's token once and keeps it out of the page and
/// its address.
#[test]
fn the_operator_page_shows_jobs_running_and_ending_in_a_headless_browser() {
    const TOKEN: &str = "page-t0ken-Secret";
    let mut fleet = Fleet::new("");
    let gate = fleet.path("release");
    std::fs::write(fleet.path("code/score.py"), gated_script(&gate)).unwrap();
    // Two quick mini-batches first (key order), then four that hold until the gate opens.
    for name in [
        "<b>a-quick0.txt",
        "<b>a-quick1.txt",
        "<b>b-hold2.txt",
        "<b>b-hold3.txt",
        "<b>b-hold4.txt",
        "<b>b-hold5.txt",
    ] {
        let path = fleet.path(&format!("page-in/{name}"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, name).unwrap();
    }
    std::fs::create_dir_all(fleet.path("bad-in")).unwrap();
    std::fs::write(fleet.path("bad-in/bad0.txt"), "bad").unwrap();
    let s3 = fleet.storage("");
    fleet
        .runtime
        .block_on(s3.create_bucket_if_missing())
        .unwrap();
    fleet.worker("w1", 2);

    let (_serve, base) = fleet.serve(TOKEN);
    let driver = ChromeDriver::start(&fleet.path("chromedriver.log"));

    // A held mini-batch waits for the test, not for a timeout.
    let settings = "mini_batch_size = 1\nerror_threshold = 0\nprocess_count_per_node = 2\nrun_invocation_timeout = 300";
    let bucket = fleet.bucket.clone();
    let slow = fleet.job(
        settings,
        fleet.path("page-in").to_str().unwrap(),
        &format!("s3://{bucket}/slow-out"),
    );
    let bad = fleet.job(
        settings,
        fleet.path("bad-in").to_str().unwrap(),
        &format!("s3://{bucket}/bad-out"),
    );
    let (slow_id, bad_id) = (
        format!("page-slow-{}", random_suffix()),
        format!("page-bad-{}", random_suffix()),
    );

    fleet.runtime.block_on(async {
        let page = driver.browser().await;
        page.goto(&base).await.unwrap();
        // The API wants its token: the page asks once.
        let login = page.find(Locator::Css("#login")).await.unwrap();
        page_shows(
            &page,
            "the token form",
            "return !document.querySelector('#login').hidden;",
            vec![],
            |v| v == &json!(true),
        )
        .await;
        login
            .find(Locator::Css("#token"))
            .await
            .unwrap()
            .send_keys(TOKEN)
            .await
            .unwrap();
        login
            .find(Locator::Css("button"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        page_shows(
            &page,
            "the pool's queue",
            "return [document.querySelector('#pool').textContent, document.querySelector('#queue-ready').textContent];",
            vec![],
            |v| v[0] == json!(format!("pool {}", fleet.pool)) && v[1].as_str().is_some_and(|s| s.parse::<u64>().is_ok()),
        )
        .await;

        // Running, with progress: the two quick mini-batches are done, the rest held.
        let out = fleet.submit(&slow, &["--job-id", &slow_id]);
        assert_eq!(code(&out), 0);
        let row = page_shows(&page, "the slow job running with progress", JOB_ROW, vec![json!(slow_id)], |v| {
            v["state"] == "Running" && v["progress"] == "2 of 6 mini-batches"
        })
        .await;
        assert_eq!(row["items"], "2 succeeded, 0 failed", "{row}");
        assert_eq!(row["output"], format!("s3://{bucket}/slow-out/parallel_run_step.txt"));

        // The job's own view: its mini-batches in flight, named by their first items, whose
        // markup is text.
        page.find(Locator::Css(&format!("#jobs tr[data-job='{slow_id}'] a")))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        let held = page_shows(&page, "the slow job's mini-batches in flight", IN_FLIGHT, vec![], |v| {
            v["shown"] == true && v["job"] == json!(slow_id) && v["first_items"].as_array().is_some_and(|a| a.len() == 2)
        })
        .await;
        for item in held["first_items"].as_array().unwrap() {
            let item = item.as_str().unwrap();
            assert!(item.contains("<b>b-hold"), "{held}");
        }
        assert_eq!(held["foreign"], 0, "markup from a job became elements: {held}");

        // Its end.
        std::fs::write(&gate, "").unwrap();
        page_shows(&page, "the slow job completed", JOB_ROW, vec![json!(slow_id)], |v| {
            v["state"] == "Completed" && v["progress"] == "6 of 6 mini-batches"
        })
        .await;

        // A failed job and its cause.
        let out = fleet.submit(&bad, &["--job-id", &bad_id]);
        assert_eq!(code(&out), 0);
        let row = page_shows(&page, "the bad job failed", JOB_ROW, vec![json!(bad_id)], |v| {
            v["state"] == "Failed"
        })
        .await;
        let failures = row["failures"].as_str().unwrap();
        assert!(failures.contains("error_threshold exceeded"), "{row}");

        // The token is neither in the page nor in its address.
        assert!(!page.source().await.unwrap().contains(TOKEN));
        assert!(!page.current_url().await.unwrap().as_str().contains(TOKEN));
        page.close().await.unwrap();
    });
}
