import XCTest
@testable import HeraldCore

/// Parses `text` as JSON, failing the test (and returning `.null`) if it does not parse.
func json(_ text: String, file: StaticString = #filePath, line: UInt = #line) -> JSON {
    do { return try JSONParser.parse(text) } catch {
        XCTFail("did not parse: \(error.message): \(text.prefix(200))", file: file, line: line)
        return .null
    }
}

func bytes(_ text: String) -> [UInt8] { Array(text.utf8) }

/// The JSON error `body` throws, or nil when it parses.
func jsonError(_ body: [UInt8], maxDepth: Int = JSONParser.defaultMaxDepth) -> JSONError? {
    do { _ = try JSONParser.parse(body, maxDepth: maxDepth); return nil } catch { return error }
}

func jsonError(_ text: String) -> JSONError? { jsonError(Array(text.utf8)) }

/// Runs a throwing HeraldCore call and returns the HeraldError, failing if it succeeded.
func heraldError<T>(_ body: () throws(HeraldError) -> T, file: StaticString = #filePath, line: UInt = #line) -> HeraldError? {
    do {
        let v = try body()
        XCTFail("expected an error, got \(v)", file: file, line: line)
        return nil
    } catch { return error }
}

func assertBadRequest<T>(_ body: () throws(HeraldError) -> T, _ message: String = "",
                         file: StaticString = #filePath, line: UInt = #line) {
    guard let e = heraldError(body, file: file, line: line) else { return }
    XCTAssertEqual(e.code, .badRequest, "\(message) — \(e)", file: file, line: line)
}

/// 2026-11-22T10:00:00.000Z
let T0: Millis = 1_795_341_600_000

/// XCTest brings Foundation's `Notification` into scope too.
typealias Note = HeraldCore.Notification

extension HeraldCore.Notification {
    static func sample(id: String = "n_01AAAAAAAAAAAAAAAAAAAAAAAA", anid: String = "task-42", user: String = "alice",
                       platforms: [Platform]? = nil, tags: String? = nil, read: ReadState = .unread,
                       version: Int64 = 1) -> Note {
        Note(id: id, appNotificationId: anid, userId: user, payload: ["title": "hi"],
                     targetPlatforms: platforms, targetTags: tags.map { try! TagExpression.parse($0) },
                     createdAt: T0, updatedAt: T0, expiresAt: T0 + 30 * 86_400_000,
                     readState: read, version: version)
    }
}
