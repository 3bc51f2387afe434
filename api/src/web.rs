//! The web UI at `/`, embedded in the binary from `web/`.
//!
//! Static files and no build step or CDN: `index.html` (the page and its
//! view templates), `app.css`, and JavaScript as ES modules that the browser
//! loads and links itself. `app.js`, the entry, routes the URL hash to a
//! view and feeds it the events of `/v1/events/stream`; `js/views/` holds
//! one module per view — jobs, a job with its curves, cluster map, timeline
//! and logs, comparing runs, sweeps, executors, usage, and a JSON editor
//! that submits specs and shows the API's field errors beside the fields;
//! `js/` holds what views share: the REST client (the same API as every
//! other client) with its token prompt, the event stream, DOM and
//! formatting helpers, the chart and the cluster map.
//!
//! `ASSETS` lists every file but the page, each served at `/assets/` plus
//! its path under `web/`, so that a module's relative `import` names the
//! same file in the browser as on disk; any other path under `/assets/` is
//! a 404. All are served with `no-cache`, so a new binary's page is picked
//! up at the next load.

use crate::AppState;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";

const INDEX_HTML: &str = include_str!("../../web/index.html");

/// One entry of [`ASSETS`]: the path under `web/` (and under `/assets/`),
/// the content type, and the file, embedded.
macro_rules! asset {
    ($path:literal, $content_type:expr) => {
        (
            $path,
            $content_type,
            include_str!(concat!("../../web/", $path)),
        )
    };
}

/// The page's files under `/assets/`: path, content type, text. A module
/// left out here is a 404 that stops the page at its `import`; the tests
/// below check every import, and every file in `web/`, against this table.
const ASSETS: &[(&str, &str, &str)] = &[
    asset!("app.css", CSS),
    asset!("app.js", JS),
    asset!("js/api.js", JS),
    asset!("js/chart.js", JS),
    asset!("js/cluster.js", JS),
    asset!("js/dom.js", JS),
    asset!("js/events.js", JS),
    asset!("js/format.js", JS),
    asset!("js/widgets.js", JS),
    asset!("js/views/compare.js", JS),
    asset!("js/views/executors.js", JS),
    asset!("js/views/job.js", JS),
    asset!("js/views/jobs.js", JS),
    asset!("js/views/submit.js", JS),
    asset!("js/views/sweeps.js", JS),
    asset!("js/views/usage.js", JS),
];

/// `/`, `/index.html` and the page's assets under `/assets/`.
pub fn routes() -> Router<AppState> {
    let page = || async { asset(HTML, INDEX_HTML) };
    ASSETS.iter().fold(
        Router::new()
            .route("/", get(page))
            .route("/index.html", get(page)),
        |router, &(path, content_type, body)| {
            router.route(
                &format!("/assets/{path}"),
                get(move || async move { asset(content_type, body) }),
            )
        },
    )
}

fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::path::Path;

    /// The module specifiers of a file's static `import … from "…"`
    /// statements (the page's modules put each on a line of its own).
    fn imports(js: &str) -> Vec<&str> {
        js.lines()
            .filter(|l| l.starts_with("import "))
            .map(|l| {
                let quoted = l
                    .rsplit_once(" from ")
                    .map_or(&l["import ".len()..], |(_, q)| q);
                quoted
                    .trim_end_matches(';')
                    .trim_matches(|c| c == '"' || c == '\'')
            })
            .collect()
    }

    fn served() -> BTreeSet<&'static str> {
        ASSETS.iter().map(|&(path, _, _)| path).collect()
    }

    #[test]
    fn every_import_of_every_module_is_served() {
        let served = served();
        assert_eq!(served.len(), ASSETS.len(), "a path is listed twice");
        let base = url::Url::parse("http://page/assets/").unwrap();
        let mut checked = 0;
        for &(path, content_type, body) in ASSETS {
            if content_type != JS {
                continue;
            }
            let at = base.join(path).unwrap();
            for spec in imports(body) {
                assert!(
                    spec.starts_with("./") || spec.starts_with("../"),
                    "{path} imports {spec}: only relative imports resolve without a build step"
                );
                let target = at.join(spec).unwrap();
                let rel = target.path().strip_prefix("/assets/").unwrap_or("");
                assert!(
                    served.contains(rel),
                    "{path} imports {spec}, which resolves to {}, not served",
                    target.path()
                );
                checked += 1;
            }
        }
        assert!(checked > 10, "only {checked} imports found");
        assert!(INDEX_HTML.contains(r#"<script type="module" src="/assets/app.js">"#));
    }

    /// Every file in `web/` is the page or in [`ASSETS`]: a new module
    /// cannot be forgotten here.
    #[test]
    fn every_file_of_the_web_folder_is_served() {
        fn walk(dir: &Path, root: &Path, out: &mut Vec<String>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let p = entry.unwrap().path();
                if p.is_dir() {
                    walk(&p, root, out);
                } else {
                    let rel = p.strip_prefix(root).unwrap().to_str().unwrap();
                    out.push(rel.replace('\\', "/"));
                }
            }
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../web");
        let mut files = Vec::new();
        walk(&root, &root, &mut files);
        let served = served();
        for f in files.iter().filter(|f| *f != "index.html") {
            assert!(served.contains(f.as_str()), "web/{f} is not in ASSETS");
        }
        assert_eq!(files.len(), ASSETS.len() + 1, "{files:?}");
    }

    #[test]
    fn imports_are_read_from_import_lines() {
        let js = "// import nothing\nimport { a, b } from \"./a.js\";\nimport \"../side.js\";\nconst x = 1;\n";
        assert_eq!(imports(js), ["./a.js", "../side.js"]);
    }
}
