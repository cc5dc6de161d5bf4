import XCTest
import HeraldCore
import HeraldCrypto
import HeraldPorts
@testable import HeraldGateway

final class WebhookTests: XCTestCase {
    /// The Standard Webhooks libraries' own test vector.
    func testTheSignatureMatchesTheStandardWebhooksVector() throws {
        let key = try XCTUnwrap(WebhookEndpoint.key(ofSecret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"))
        let header = WebhookSignature.header(keys: [try XCTUnwrap(HMACSHA256.Key(key))], id: "msg_p5jXN8AQM9LWM0D4loKWxJek", timestamp: 1_614_265_330,
                                             body: Array(#"{"test": 2432232314}"#.utf8))
        XCTAssertEqual(header, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
    }

    func testWhileRotatingEachSecretSignsNewestFirst() throws {
        let new = try XCTUnwrap(HMACSHA256.Key([UInt8](repeating: 1, count: 32)))
        let old = try XCTUnwrap(HMACSHA256.Key([UInt8](repeating: 2, count: 32)))
        let both = WebhookSignature.header(keys: [new, old], id: "msg_1", timestamp: 1, body: [])
        let parts = both.split(separator: " ").map(String.init)
        XCTAssertEqual(parts, [WebhookSignature.header(keys: [new], id: "msg_1", timestamp: 1, body: []),
                               WebhookSignature.header(keys: [old], id: "msg_1", timestamp: 1, body: [])])
    }

    func testSecretsAreWhsecAndTheBase64Of24To64Bytes() {
        func secret(_ n: Int) -> String { "whsec_" + Base64.encode([UInt8](repeating: 7, count: n)) }
        XCTAssertEqual(WebhookEndpoint.key(ofSecret: secret(24))?.count, 24)
        XCTAssertEqual(WebhookEndpoint.key(ofSecret: secret(64))?.count, 64)
        XCTAssertNil(WebhookEndpoint.key(ofSecret: secret(23)))
        XCTAssertNil(WebhookEndpoint.key(ofSecret: secret(65)))
        XCTAssertNil(WebhookEndpoint.key(ofSecret: String(secret(32).dropFirst(6))), "without whsec_")
        XCTAssertNil(WebhookEndpoint.key(ofSecret: "whsec_not base64!"))
    }

    func testTheEndpointsDescriptionLeavesItsSecretsOut() {
        let e = WebhookEndpoint(url: "https://example.com/h", secrets: [Array("supersecretbytes-supersecret".utf8)])
        XCTAssertEqual("\(e)", "webhook https://example.com/h")
    }

    func testBackoffDoublesFromFiveSecondsToAnHourWithJitterAndRetryAfter() {
        let none: (Millis) -> Millis = { _ in 0 }, most: (Millis) -> Millis = { $0 }
        XCTAssertEqual(WebhookDispatch.delay(attempts: 0, retryAfterSeconds: nil, jitter: none), 5_000)
        XCTAssertEqual(WebhookDispatch.delay(attempts: 1, retryAfterSeconds: nil, jitter: none), 10_000)
        XCTAssertEqual(WebhookDispatch.delay(attempts: 3, retryAfterSeconds: nil, jitter: none), 40_000)
        XCTAssertEqual(WebhookDispatch.delay(attempts: 0, retryAfterSeconds: nil, jitter: most), 6_250, "a quarter more at most")
        XCTAssertEqual(WebhookDispatch.delay(attempts: 10, retryAfterSeconds: nil, jitter: none), 3_600_000)
        XCTAssertEqual(WebhookDispatch.delay(attempts: 50, retryAfterSeconds: nil, jitter: most), 3_600_000, "never more than an hour")
        XCTAssertEqual(WebhookDispatch.delay(attempts: 0, retryAfterSeconds: 30, jitter: none), 30_000, "no sooner than Retry-After")
        XCTAssertEqual(WebhookDispatch.delay(attempts: 3, retryAfterSeconds: 2, jitter: none), 40_000)
        XCTAssertEqual(WebhookDispatch.delay(attempts: 0, retryAfterSeconds: 86_400, jitter: none), 3_600_000)
        XCTAssertEqual(WebhookDispatch.delay(attempts: 0, retryAfterSeconds: -5, jitter: none), 5_000)
    }
}

/// The outbox's recording end, in process: what a batch records, and that
/// a rolled-back one records nothing. The endpoint refuses connections
/// (port 9 on loopback), so what was recorded stays pending.
final class WebhookOutboxTests: XCTestCase {
    func app(events: Set<WebhookEventType>? = nil) -> AppConfig {
        AppConfig(id: Harness.app.id, serverKeys: Harness.app.serverKeys, tokenSecrets: Harness.app.tokenSecrets,
                  webhooks: [WebhookEndpoint(url: "http://127.0.0.1:9/hooks", secrets: [[UInt8](repeating: 1, count: 32)], events: events)])
    }

    func testAFailedCommitRecordsNoEventAndTheNextBatchOnlyItsOwn() throws {
        let store = FailingStore()
        let h = Harness(store: store, apps: [app()])
        store.failCommits = 1
        let failed = h.publish("u", "n0")
        h.settle()
        XCTAssertEqual(failed.response?.status, 503)
        XCTAssertEqual(try store.pendingWebhooks(), 0, "nothing of the rolled-back batch")
        let published = h.publish("u", "n1")
        h.settle()
        XCTAssertEqual(published.response?.status, 201)
        XCTAssertEqual(try store.pendingWebhooks(), 1, "notification.created, kept until delivered")
    }

    func testAnEndpointGetsOnlyTheTypesItTakes() throws {
        let store = FailingStore()
        let h = Harness(store: store, apps: [app(events: [.read])])
        let published = h.publish("u", "n0")
        h.settle()
        XCTAssertEqual(published.response?.status, 201)
        XCTAssertEqual(try store.pendingWebhooks(), 0, "a publish gives no notification.read")
    }
}
