//! The test S3 server (Garage, which `scripts/test` starts) as the
//! end-to-end tests use it: a fresh prefix per test, the settings the API
//! and the executors are given, and direct reads and writes through
//! `trainyard-store` to check what landed there.

/// The test S3 server under a prefix of one test's own.
pub struct TestS3 {
    /// `s3://BUCKET/e2e-<uuid>`: where this test's objects go.
    pub url: String,
    endpoint: String,
    region: String,
    key: String,
    secret: String,
}

impl TestS3 {
    /// The test S3 server `scripts/test` started, under a fresh prefix.
    pub fn from_env() -> TestS3 {
        let var = |k: &str| {
            std::env::var(k).unwrap_or_else(|_| {
                panic!("{k} is not set: run ./scripts/test, which starts a Garage S3 server for these tests")
            })
        };
        TestS3 {
            url: format!(
                "{}/e2e-{}",
                var("TRAINYARD_TEST_S3_URL"),
                uuid::Uuid::new_v4().simple()
            ),
            endpoint: var("TRAINYARD_TEST_S3_ENDPOINT"),
            region: var("TRAINYARD_TEST_S3_REGION"),
            key: var("TRAINYARD_TEST_S3_ACCESS_KEY_ID"),
            secret: var("TRAINYARD_TEST_S3_SECRET_ACCESS_KEY"),
        }
    }

    /// The server's endpoint (`http://host:port`).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The standard AWS variables (how the API is configured here).
    pub fn aws_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID", self.key.clone()),
            ("AWS_SECRET_ACCESS_KEY", self.secret.clone()),
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            ("AWS_REGION", self.region.clone()),
            ("AWS_ALLOW_HTTP", "true".into()),
        ]
    }

    /// Object-store options (how the executors are configured here).
    pub fn options(&self) -> String {
        format!(
            "aws_endpoint={},aws_region={},aws_access_key_id={},aws_secret_access_key={},aws_allow_http=true",
            self.endpoint, self.region, self.key, self.secret
        )
    }

    /// The store, and a runtime to drive it.
    pub fn store(&self) -> (trainyard_store::Store, tokio::runtime::Runtime) {
        let opts: Vec<(String, String)> = self
            .options()
            .split(',')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let store = trainyard_store::Store::open(&self.url, &opts).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        (store, rt)
    }

    /// Keys under `prefix`, read straight from the S3 server.
    pub fn list(&self, prefix: &str) -> Vec<String> {
        let (store, rt) = self.store();
        rt.block_on(store.list(prefix))
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect()
    }

    /// Writes and reads back an object larger than one multipart part.
    pub fn multipart_round_trip(&self) {
        let (store, rt) = self.store();
        let big: Vec<u8> = (0..trainyard_store::MULTIPART_PART * 2 + 17)
            .map(|i| (i % 251) as u8)
            .collect();
        rt.block_on(store.put("multipart/big", big.clone().into()))
            .unwrap();
        assert_eq!(rt.block_on(store.get("multipart/big")).unwrap(), big);
    }

    /// Uploads a local file; returns its URL.
    pub fn upload(&self, key: &str, file: &std::path::Path) -> String {
        let (store, rt) = self.store();
        rt.block_on(store.put(key, std::fs::read(file).unwrap().into()))
            .unwrap();
        store.url_of(key)
    }
}
