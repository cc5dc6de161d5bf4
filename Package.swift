// swift-tools-version:6.0
import PackageDescription

// Herald takes no Swift package dependencies: C libraries come from Debian
// -dev packages through system library targets.
let package = Package(
    name: "Herald",
    // For HeraldClient (Mutex and Observation need these); the gateway runs on Linux.
    platforms: [.macOS(.v15), .iOS(.v18)],
    products: [
        .executable(name: "herald", targets: ["herald"]),
        .library(name: "HeraldClient", targets: ["HeraldClient"]),
        // The libwebsockets transport, for Linux apps: HeraldClient's default there.
        .library(name: "HeraldClientLWS", targets: ["HeraldClientLWS"]),
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
        .systemLibrary(name: "CNGHTTP2", pkgConfig: "libnghttp2",
                       providers: [.apt(["libnghttp2-dev"])]),
        .systemLibrary(name: "CSSL", pkgConfig: "libssl",
                       providers: [.apt(["libssl-dev"])]),

        // Pure domain: model, JSON, change feed, cursors, tag expressions,
        // protocol messages, token claims, store interface. No I/O and no C
        // library, so that HeraldClient shares it on every platform.
        .target(name: "HeraldCore"),
        // The gateway's cryptography through libcrypto: device tokens (HS256),
        // the WebSocket handshake's SHA-1, P-256 key checks.
        .target(name: "HeraldCrypto", dependencies: ["HeraldCore", "CCrypto"]),
        // SQLite's default page cache, wrapped so that commits skip a needless scan of it.
        .target(name: "CSQLitePageCache", dependencies: ["CSQLite"]),
        // Store implementations behind HeraldCore.NotificationStore.
        .target(name: "HeraldStores", dependencies: ["HeraldCore", "CSQLite", "CSQLitePageCache", "CPostgres"]),
        // What the gateway asks of its adapters (the bus, push transport, service
        // loops, clock, apps' settings) and the locks and logging they share.
        .target(name: "HeraldPorts", dependencies: ["HeraldCore"]),
        // The gateway's logic: engine (store owner, fan-out), HTTP API,
        // WebSocket sessions. Knows nothing of libwebsockets.
        .target(name: "HeraldGateway", dependencies: ["HeraldCore", "HeraldCrypto", "HeraldPorts", "HeraldCurl"]),
        // The Redis bus behind HeraldPorts.Bus: the only code that talks to hiredis.
        .target(name: "HeraldRedis", dependencies: ["HeraldCore", "HeraldPorts", "CHiredis"]),
        // The only code that talks to libcurl: an HTTP/2 client on a thread of its own.
        .target(name: "HeraldCurl", dependencies: ["HeraldCore", "CCurl"]),
        // APNs' and FCM's client: HTTP/2 over nghttp2 and OpenSSL, on a thread of
        // its own, connections kept alive with PINGs (libcurl 7.88's multi interface sends none).
        .target(name: "HeraldHTTP2", dependencies: ["HeraldCore", "HeraldCurl", "CNGHTTP2", "CSSL"]),
        // Push to devices that are not connected (SPEC section 10): the services'
        // credentials and encodings (APNs, FCM, Web Push), behind HeraldPorts.PushTransport.
        .target(name: "HeraldPush", dependencies: ["HeraldCore", "HeraldCrypto", "HeraldPorts", "HeraldCurl", "HeraldHTTP2", "CCrypto"]),
        // The only code that talks to libwebsockets.
        .target(name: "HeraldTransport", dependencies: ["HeraldPorts", "HeraldGateway", "CLibWebSockets"]),
        // Parses flags and wires things up.
        .executableTarget(name: "herald",
                          dependencies: ["HeraldCore", "HeraldCrypto", "HeraldStores", "HeraldPorts", "HeraldGateway", "HeraldRedis", "HeraldTransport",
                                         "CLibWebSockets", "HeraldPush", "HeraldClient", "HeraldClientLWS"]),

        // The device-side library: local state kept in step with the gateway.
        // Shares only HeraldCore's wire types. On Apple platforms its graph
        // holds no system library (SQLite is the SDK's, the transport
        // URLSession): Tests/e2e/test_package.py checks that.
        .target(name: "HeraldClient",
                dependencies: ["HeraldCore", "HeraldClientTransport",
                               .target(name: "HeraldClientLWS", condition: .when(platforms: [.linux])),
                               .target(name: "CSQLite", condition: .when(platforms: [.linux])),
                               .target(name: "CSQLitePageCache", condition: .when(platforms: [.linux]))]),
        // What a client transport provides (WebSockets, HTTP requests), and the client's errors.
        .target(name: "HeraldClientTransport"),
        // The transport over libwebsockets' client API, each connection on a thread of its own.
        .target(name: "HeraldClientLWS", dependencies: ["HeraldClientTransport", "CLibWebSockets"]),
        // The walk-through of docs/CLIENT-SWIFT.md, compiled so it cannot rot.
        .executableTarget(name: "herald-client-example", dependencies: ["HeraldClient"],
                          path: "Examples/herald-client-example"),
        // What a client costs a device: memory per cached notification, resume time (bench/client.sh).
        .executableTarget(name: "herald-client-bench", dependencies: ["HeraldClient", "HeraldClientLWS"], path: "bench/client"),

        // What several test targets share (a reproducible PRNG, a clock the test moves).
        .target(name: "HeraldTestSupport", dependencies: ["HeraldCore", "HeraldPorts"], path: "Tests/HeraldTestSupport"),
        // The domain, and the device tokens HeraldCrypto signs from its claims.
        .testTarget(name: "HeraldCoreTests", dependencies: ["HeraldCore", "HeraldCrypto"]),
        .testTarget(name: "HeraldStoreTests", dependencies: ["HeraldCore", "HeraldStores", "HeraldTestSupport"]),
        // The gateway in-process: inline loop, engine on the test's thread, manual clock.
        .testTarget(name: "HeraldGatewayTests", dependencies: ["HeraldCore", "HeraldCrypto", "HeraldStores", "HeraldPorts", "HeraldGateway", "HeraldTestSupport"]),
        // HTTPConnection in-process: bytes in and out through a socket in memory,
        // a real gateway behind it, deadlines on the manual clock.
        .testTarget(name: "HeraldTransportTests",
                    dependencies: ["HeraldCore", "HeraldCrypto", "HeraldStores", "HeraldPorts", "HeraldGateway", "HeraldTransport", "HeraldTestSupport"]),
        // The Redis bus against a real redis-server (HERALD_TEST_REDIS_URL, scripts/test-servers).
        .testTarget(name: "HeraldRedisTests", dependencies: ["HeraldCore", "HeraldPorts", "HeraldRedis"]),
        // Seeded mutation fuzzing of the parsers, bounded in time; corpus in Tests/HeraldFuzzTests/corpus.
        .testTarget(name: "HeraldFuzzTests", dependencies: ["HeraldCore", "HeraldCrypto", "HeraldGateway", "HeraldTestSupport"],
                    resources: [.copy("corpus")]),
        // The libcurl and HTTP/2 clients against local TLS servers (HTTP/1.1 and HTTP/2).
        .testTarget(name: "HeraldCurlTests", dependencies: ["HeraldCurl", "HeraldHTTP2"], exclude: ["tls_test_server.py"]),
        // Push crypto against the RFCs' vectors, and the services' request forms.
        .testTarget(name: "HeraldPushTests", dependencies: ["HeraldCore", "HeraldCrypto", "HeraldCurl", "HeraldPorts", "HeraldPush", "CCrypto"]),
        // HeraldClient against a real `herald` process (built by `swift build`).
        .testTarget(name: "HeraldClientTests", dependencies: ["HeraldClient", "HeraldClientLWS", "HeraldCore", "HeraldCrypto"]),
    ],
    swiftLanguageModes: [.v6]
)
