import HeraldCore
import HeraldCurl
import HeraldPorts
@testable import HeraldPush
import XCTest

/// What each sender makes of a service's answer, with the error bodies the
/// services document, and what it puts in a Web Push body.
final class PushAnswerTests: XCTestCase {
    func answer(_ status: Int, _ body: String = "", retryAfter: String? = nil) -> Result<CurlResponse, CurlFailure> {
        .success(CurlResponse(status: status, headers: retryAfter.map { ["retry-after": $0] } ?? [:], body: Array(body.utf8), httpVersion: 2))
    }

    /// Google's error form, as firebase-admin-go's messaging_errors.go reads it.
    func fcmError(_ code: Int, _ status: String, _ errorCode: String?, _ message: String) -> String {
        var error: JSONObject = ["code": .int(Int64(code)), "status": .string(status), "message": .string(message)]
        if let errorCode {
            error["details"] = [["@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": .string(errorCode)]]
        }
        return String(decoding: JSON.object(["error": .object(error)]).encoded, as: UTF8.self)
    }

    func testFCMSenderIdMismatchIsADeadHandleAndOther403sRefuseTheCredentials() {
        XCTAssertEqual(FCMSender.outcome(answer(403, fcmError(403, "PERMISSION_DENIED", "SENDER_ID_MISMATCH", "SenderId mismatch"))),
                       .unregistered("FCM 403 SENDER_ID_MISMATCH", reason: "SENDER_ID_MISMATCH"))
        XCTAssertEqual(FCMSender.outcome(answer(403, fcmError(403, "PERMISSION_DENIED", nil,
                                                               "Permission 'cloudmessaging.messages.create' denied"))),
                       .credentialsRefused("FCM 403 PERMISSION_DENIED"))
        XCTAssertEqual(FCMSender.outcome(answer(401, fcmError(401, "UNAUTHENTICATED", "THIRD_PARTY_AUTH_ERROR", "x"))),
                       .credentialsRefused("FCM 401 THIRD_PARTY_AUTH_ERROR"))
    }

    func testFCMQuotaExceededWaitsAtLeastAMinute() {
        let quota = fcmError(429, "RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED", "Quota exceeded")
        XCTAssertEqual(FCMSender.outcome(answer(429, quota)), .retry("FCM 429 QUOTA_EXCEEDED", retryAfterSeconds: 60))
        XCTAssertEqual(FCMSender.outcome(answer(429, quota, retryAfter: "5")), .retry("FCM 429 QUOTA_EXCEEDED", retryAfterSeconds: 60))
        XCTAssertEqual(FCMSender.outcome(answer(429, quota, retryAfter: "120")), .retry("FCM 429 QUOTA_EXCEEDED", retryAfterSeconds: 120))
        XCTAssertEqual(FCMSender.outcome(answer(503, fcmError(503, "UNAVAILABLE", "UNAVAILABLE", "x"))),
                       .retry("FCM 503 UNAVAILABLE", retryAfterSeconds: nil), "only a 429 waits a minute")
    }

    func testReasonLabelsAreTheServicesCodesOrTheStatus() {
        XCTAssertEqual(FCMSender.outcome(answer(400, fcmError(400, "INVALID_ARGUMENT", "made up \" code", "x"))),
                       .rejected("FCM 400 made up \" code: x", reason: "400"))
        XCTAssertEqual(APNsSender.outcome(answer(400, #"{"reason": "DeviceTokenNotForTopic"}"#)),
                       .unregistered("APNs 400 DeviceTokenNotForTopic", reason: "DeviceTokenNotForTopic"))
        XCTAssertEqual(APNsSender.outcome(answer(400, #"{"reason": "TopicDisallowed"}"#)),
                       .rejected("APNs 400 TopicDisallowed", reason: "TopicDisallowed"))
        XCTAssertEqual(APNsSender.outcome(answer(400, #"{"reason": "Something\nNew"}"#)),
                       .rejected("APNs 400 Something\nNew", reason: "400"))
        XCTAssertEqual(WebPushSender.outcome(answer(410)), .unregistered("Web Push 410", reason: "410"))
    }

    func testWebPush406IsThrottlingAnd413ARefusal() {
        XCTAssertEqual(WebPushSender.outcome(answer(406, retryAfter: "30")), .retry("Web Push 406", retryAfterSeconds: 30))
        XCTAssertEqual(WebPushSender.outcome(answer(413)), .rejected("Web Push 413", reason: "413"))
    }

    func testALifetimeIsNeverSentAsZero() {
        let m = PushMessage(kind: .tap, op: .state, cursor: 1, epoch: "e", notificationId: nil, expiresAt: 100_000)
        XCTAssertEqual(m.ttlSeconds(now: 99_999), 1)
        XCTAssertEqual(m.ttlSeconds(now: 100_500), 1, "late: still not 0")
        XCTAssertEqual(m.ttlSeconds(now: 99_000), 1)
        XCTAssertEqual(m.ttlSeconds(now: 98_999), 2)
    }

    /// A message whose change, with the rest, makes a plaintext of `bytes`.
    func alert(carrying bytes: Int) -> PushMessage {
        var m = PushMessage(kind: .alert, op: .upsert, cursor: 1, epoch: "e", notificationId: "n1", title: "t", body: "b",
                            change: ["pad": ""], expiresAt: 1)
        let base = WebPushSender.plaintext(m).count
        m.change = ["pad": .string(String(repeating: "x", count: bytes - base))]
        return m
    }

    func testTheChangeRidesOnlyWithinTheSmallestLimit() throws {
        let fits = alert(carrying: WebPushSender.smallestLimit - WebPushEncryption.overhead)
        let body = WebPushSender.plaintext(fits)
        XCTAssertEqual(body.count + WebPushEncryption.overhead, 2_744)
        XCTAssertNotNil(try JSONParser.parse(body).objectValue?["change"])
        let encrypted = try WebPushEncryption.encrypt(plaintext: body, p256dh: WebPushEncryptionTests.userAgentPublic,
                                                      auth: WebPushEncryptionTests.auth)
        XCTAssertEqual(encrypted.count, 2_744, "the overhead is what encryption adds")
        let over = WebPushSender.plaintext(alert(carrying: WebPushSender.smallestLimit - WebPushEncryption.overhead + 1))
        XCTAssertNil(try JSONParser.parse(over).objectValue?["change"])
        XCTAssertEqual(try JSONParser.parse(over).objectValue?["title"], "t")
    }

    func testTheSmallestBodyCutsTheTextToFit() throws {
        let long = PushMessage(kind: .alert, op: .upsert, cursor: 1, epoch: "e", notificationId: "n1",
                               title: String(repeating: "é", count: 1_500), body: "b", change: ["small": 1], expiresAt: 1)
        let usual = WebPushSender.plaintext(long), smallest = WebPushSender.plaintext(long, within: WebPushSender.smallestLimit)
        XCTAssertGreaterThan(usual.count + WebPushEncryption.overhead, 2_744)
        XCTAssertLessThanOrEqual(usual.count + WebPushEncryption.overhead, 4_096)
        XCTAssertLessThanOrEqual(smallest.count + WebPushEncryption.overhead, 2_744)
        let o = try JSONParser.parse(smallest).objectValue
        XCTAssertNil(o?["change"])
        XCTAssertTrue(o?["title"]?.stringValue?.hasSuffix("…") ?? false)
        XCTAssertEqual(o?["herald"]?.objectValue?["id"], "n1")
    }
}
