// swift-tools-version:6.0
import PackageDescription

// Herald takes no Swift package dependencies: C libraries come from Debian
// -dev packages through system library targets.
let package = Package(
    name: "Herald",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "herald", targets: ["herald"]),
        .library(name: "HeraldClient", targets: ["HeraldClient"]),
    ],
    targets: [
        .systemLibrary(name: "CLibWebSockets", pkgConfig: "libwebsockets",
                       providers: [.apt(["libwebsockets-dev"])]),
        .systemLibrary(name: "CSQLite", pkgConfig: "sqlite3",
                       providers: [.apt(["libsqlite3-dev"])]),
        .systemLibrary(name: "CCrypto", pkgConfig: "libcrypto",
                       providers: [.apt(["libssl-dev"])]),
        .systemLibrary(name: "CPostgres", pkgConfig: "libpq",
                       providers: [.apt(["libpq-dev"])]),
        .systemLibrary(name: "CHiredis", pkgConfig: "hiredis",
                       providers: [.apt(["libhiredis-dev"])]),
        // Debian's libcurl is built with nghttp2: HTTP/2, which APNs requires.
        .systemLibrary(name: "CCurl", pkgConfig: "libcurl",
                       providers: [.apt(["libcurl4-openssl-dev"])]),

        // Pure domain: model, JSON, change feed, cursors, tag expressions,
        // protocol messages, tokens, store interface. No I/O.
        .target(name: "HeraldCore", dependencies: ["CCrypto"]),
        // SQLite's default page cache, wrapped so that commits skip a needless scan of it.
        .target(name: "CSQLitePageCache", dependencies: ["CSQLite"]),
        // Store implementations behind HeraldCore.NotificationStore.
        .target(name: "HeraldStores", dependencies: ["HeraldCore", "CSQLite", "CSQLitePageCache", "CPostgres"]),
        // The gateway's logic: engine (store owner, fan-out), HTTP API,
        // WebSocket sessions. Knows nothing of libwebsockets.
        .target(name: "HeraldGateway", dependencies: ["HeraldCore"]),
        // The Redis bus behind HeraldGateway.Bus: the only code that talks to hiredis.
        .target(name: "HeraldRedis", dependencies: ["HeraldCore", "HeraldGateway", "CHiredis"]),
        // The only code that talks to libcurl: an HTTP/2 client on a thread of its own.
        .target(name: "HeraldCurl", dependencies: ["HeraldCore", "CCurl"]),
        // Push to devices that are not connected (SPEC section 10): the services'
        // credentials and encodings (APNs, FCM, Web Push), behind HeraldGateway.PushTransport.
        .target(name: "HeraldPush", dependencies: ["HeraldCore", "HeraldGateway", "HeraldCurl", "CCrypto"]),
        // The only code that talks to libwebsockets.
        .target(name: "HeraldTransport", dependencies: ["HeraldGateway", "CLibWebSockets"]),
        // Parses flags and wires things up.
        .executableTarget(name: "herald",
                          dependencies: ["HeraldCore", "HeraldStores", "HeraldGateway", "HeraldRedis", "HeraldTransport", "CLibWebSockets",
                                         "HeraldPush", "HeraldClient"]),

        // The device-side library: local state kept in step with the gateway
        // over the libwebsockets client API. Shares only HeraldCore's wire types.
        .target(name: "HeraldClient", dependencies: ["HeraldCore", "CLibWebSockets", "CSQLite", "CSQLitePageCache"]),
        // The walk-through of docs/CLIENT-SWIFT.md, compiled so it cannot rot.
        .executableTarget(name: "herald-client-example", dependencies: ["HeraldClient"],
                          path: "Examples/herald-client-example"),
        // What a client costs a device: memory per cached notification, resume time (bench/client.sh).
        .executableTarget(name: "herald-client-bench", dependencies: ["HeraldClient"], path: "bench/client"),

        // What several test targets share (a reproducible PRNG).
        .target(name: "HeraldTestSupport", path: "Tests/HeraldTestSupport"),
        .testTarget(name: "HeraldCoreTests", dependencies: ["HeraldCore"]),
        .testTarget(name: "HeraldStoreTests", dependencies: ["HeraldCore", "HeraldStores", "HeraldTestSupport"]),
        // The gateway in-process: inline loop, engine on the test's thread, manual clock.
        .testTarget(name: "HeraldGatewayTests", dependencies: ["HeraldCore", "HeraldStores", "HeraldGateway", "HeraldTestSupport"]),
        // The Redis bus against a real redis-server (HERALD_TEST_REDIS_URL, scripts/test-servers).
        .testTarget(name: "HeraldRedisTests", dependencies: ["HeraldCore", "HeraldGateway", "HeraldRedis"]),
        // Seeded mutation fuzzing of the parsers, bounded in time; corpus in Tests/HeraldFuzzTests/corpus.
        .testTarget(name: "HeraldFuzzTests", dependencies: ["HeraldCore", "HeraldGateway", "HeraldTestSupport"],
                    resources: [.copy("corpus")]),
        // The libcurl client against local TLS servers (HTTP/1.1 and HTTP/2).
        .testTarget(name: "HeraldCurlTests", dependencies: ["HeraldCurl"], exclude: ["tls_test_server.py"]),
        // Push crypto against the RFCs' vectors, and the services' request forms.
        .testTarget(name: "HeraldPushTests", dependencies: ["HeraldCore", "HeraldPush", "CCrypto"]),
        // HeraldClient against a real `herald` process (built by `swift build`).
        .testTarget(name: "HeraldClientTests", dependencies: ["HeraldClient", "HeraldCore"]),
    ],
    swiftLanguageModes: [.v6]
)
