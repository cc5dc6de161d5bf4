import XCTest
@testable import HeraldCore

final class ClientMessageTests: XCTestCase {
    typealias DecodeError = ClientMessage.DecodeError

    func decode(_ text: String) -> Result<ClientMessage, DecodeError> { ClientMessage.decode(json(text)) }

    func ok(_ text: String, file: StaticString = #filePath, line: UInt = #line) -> ClientMessage? {
        switch decode(text) {
        case .success(let m): return m
        case .failure(let e):
            XCTFail("\(text.prefix(120)): \(e.error)", file: file, line: line)
            return nil
        }
    }

    func fail(_ text: String, file: StaticString = #filePath, line: UInt = #line) -> DecodeError? {
        switch decode(text) {
        case .success(let m):
            XCTFail("accepted \(text.prefix(120)) as \(m)", file: file, line: line)
            return nil
        case .failure(let e): return e
        }
    }

    // MARK: hello

    func testHelloMinimal() {
        XCTAssertEqual(ok(#"{"type":"hello","token":"t.o.k","deviceId":"phone-1"}"#),
                       .hello(token: "t.o.k", deviceId: "phone-1", registration: DeviceRegistration(),
                              position: FeedPosition(cursor: nil, epoch: nil)))
    }

    func testHelloFull() {
        XCTAssertEqual(ok(#"{"type":"hello","token":"tok","deviceId":"phone-1","platform":"ios","tags":["lang:it","lang:it","x"],"cursor":41,"epoch":"e1"}"#),
                       .hello(token: "tok", deviceId: "phone-1", registration: DeviceRegistration(platform: .ios, tags: ["lang:it", "x"]),
                              position: FeedPosition(cursor: 41, epoch: "e1")))
        XCTAssertEqual(ok(#"{"type":"hello","token":"tok","deviceId":"d","cursor":0,"epoch":null,"platform":null,"tags":null}"#),
                       .hello(token: "tok", deviceId: "d", registration: DeviceRegistration(),
                              position: FeedPosition(cursor: 0, epoch: nil)))
    }

    func testHelloWithoutTokenIsMissingToken() {
        for text in [#"{"type":"hello","deviceId":"phone-1"}"#, #"{"type":"hello","token":null,"deviceId":"phone-1"}"#,
                     #"{"type":"hello","token":42,"deviceId":"phone-1"}"#, #"{"type":"hello"}"#,
                     #"{"type":"hello","token":{"a":1},"deviceId":"bad id"}"#,
                     #"{"type":"hello","token":"\#(String(repeating: "t", count: 8193))","deviceId":"phone-1"}"#] {
            let e = fail(text)
            XCTAssertEqual(e?.isHello, true, text.prefix(80).description)
            XCTAssertEqual(e?.missingToken, true, text.prefix(80).description)
            XCTAssertEqual(e?.error.code, .unauthorized, text.prefix(80).description)
        }
        XCTAssertNotNil(ok(#"{"type":"hello","token":"\#(String(repeating: "t", count: 8192))","deviceId":"phone-1"}"#))
    }

    func testMalformedHelloWithATokenIsABadRequestNotMissingToken() {
        for text in [
            #"{"type":"hello","token":"tok"}"#, #"{"type":"hello","token":"tok","deviceId":""}"#,
            #"{"type":"hello","token":"tok","deviceId":"bad id"}"#, #"{"type":"hello","token":"tok","deviceId":5}"#,
            #"{"type":"hello","token":"tok","deviceId":"\#(String(repeating: "d", count: 129))"}"#,
            #"{"type":"hello","token":"tok","deviceId":"d","platform":"mac"}"#,
            #"{"type":"hello","token":"tok","deviceId":"d","tags":["user:bob"]}"#,
            #"{"type":"hello","token":"tok","deviceId":"d","tags":["a b"]}"#,
            #"{"type":"hello","token":"tok","deviceId":"d","tags":"a"}"#,
            #"{"type":"hello","token":"tok","deviceId":"d","tags":[\#((0..<61).map { "\"t\($0)\"" }.joined(separator: ","))]}"#,
            #"{"type":"hello","token":"tok","deviceId":"d","cursor":-1}"#,
            #"{"type":"hello","token":"tok","deviceId":"d","cursor":"5"}"#,
            #"{"type":"hello","token":"tok","deviceId":"d","cursor":1.5}"#,
            #"{"type":"hello","token":"tok","deviceId":"d","epoch":5}"#,
            #"{"type":"hello","token":"tok","deviceId":"d","extra":true}"#,
            #"{"type":"hello","token":"tok","deviceId":"d","ref":5}"#,
        ] {
            let e = fail(text)
            XCTAssertEqual(e?.isHello, true, text)
            XCTAssertEqual(e?.missingToken, false, text)
            XCTAssertEqual(e?.error.code, .badRequest, text)
        }
    }

    // MARK: update

    func testUpdate() {
        XCTAssertEqual(ok(#"{"type":"update","ref":"c1","id":"n_1","readState":"read","userActionState":"dismissed","ifVersion":3}"#),
                       .update(ref: "c1", id: "n_1", update: StateUpdate(readState: .read, userActionState: .dismissed, ifVersion: 3)))
        XCTAssertEqual(ok(#"{"type":"update","id":"n_1","userActionState":"activated"}"#),
                       .update(ref: nil, id: "n_1", update: StateUpdate(userActionState: .activated)))
        XCTAssertEqual(ok(#"{"type":"update","id":"n_1","seenState":"seen"}"#),
                       .update(ref: nil, id: "n_1", update: StateUpdate(seenState: .seen)))
        XCTAssertEqual(ok(#"{"type":"update","id":"n_1","readState":"unread","ifVersion":null}"#),
                       .update(ref: nil, id: "n_1", update: StateUpdate(readState: .unread)))
    }

    func testBadUpdates() {
        for text in [
            #"{"type":"update","ref":"c1","id":"n_1"}"#, // no state field
            #"{"type":"update","ref":"c1","id":"n_1","readState":null}"#,
            #"{"type":"update","ref":"c1","readState":"read"}"#, // no id
            #"{"type":"update","ref":"c1","id":5,"readState":"read"}"#,
            #"{"type":"update","ref":"c1","id":"n_1","readState":"seen"}"#,
            #"{"type":"update","ref":"c1","id":"n_1","userActionState":"clicked"}"#,
            #"{"type":"update","ref":"c1","id":"n_1","readState":"read","ifVersion":0}"#,
            #"{"type":"update","ref":"c1","id":"n_1","readState":"read","ifVersion":"3"}"#,
            #"{"type":"update","ref":"c1","id":"n_1","readState":"read","ifVersion":-2}"#,
            #"{"type":"update","ref":"c1","id":"n_1","readState":"read","version":3}"#,
            #"{"type":"update","ref":"c1","id":"\#(String(repeating: "n", count: 129))","readState":"read"}"#,
        ] {
            let e = fail(text)
            XCTAssertEqual(e?.error.code, .badRequest, text)
            XCTAssertEqual(e?.ref, "c1", "ref echoed: \(text)")
            XCTAssertEqual(e?.isHello, false)
            XCTAssertEqual(e?.missingToken, false)
        }
    }

    // MARK: delete, sync, refresh, ping

    func testDelete() {
        XCTAssertEqual(ok(#"{"type":"delete","ref":"c2","id":"n_9"}"#), .delete(ref: "c2", id: "n_9"))
        XCTAssertEqual(fail(#"{"type":"delete","ref":"c2"}"#)?.ref, "c2")
        XCTAssertEqual(fail(#"{"type":"delete","ref":"c2","id":null}"#)?.error.code, .badRequest)
        XCTAssertEqual(fail(#"{"type":"delete","ref":"c2","id":"n","readState":"read"}"#)?.error.code, .badRequest)
    }

    func testSync() {
        XCTAssertEqual(ok(#"{"type":"sync","ref":"c3","cursor":7,"epoch":"e"}"#),
                       .sync(ref: "c3", position: FeedPosition(cursor: 7, epoch: "e")))
        XCTAssertEqual(ok(#"{"type":"sync","ref":"c3"}"#), .sync(ref: "c3", position: FeedPosition(cursor: nil, epoch: nil)))
        XCTAssertEqual(ok(#"{"type":"sync","cursor":0}"#), .sync(ref: nil, position: FeedPosition(cursor: 0, epoch: nil)))
        for text in [#"{"type":"sync","ref":"c3","cursor":-1}"#, #"{"type":"sync","ref":"c3","cursor":"7"}"#,
                     #"{"type":"sync","ref":"c3","cursor":7,"epoch":7}"#, #"{"type":"sync","ref":"c3","cursor":1e2}"#,
                     #"{"type":"sync","ref":"c3","epoch":"\#(String(repeating: "e", count: 129))"}"#,
                     #"{"type":"sync","ref":"c3","limit":5}"#] {
            XCTAssertEqual(fail(text)?.ref, "c3", text)
        }
    }

    func testRefresh() {
        XCTAssertEqual(ok(#"{"type":"refresh","ref":"c4","token":"new"}"#), .refresh(ref: "c4", token: "new"))
        for text in [#"{"type":"refresh","ref":"c4"}"#, #"{"type":"refresh","ref":"c4","token":5}"#,
                     #"{"type":"refresh","ref":"c4","token":null}"#,
                     #"{"type":"refresh","ref":"c4","token":"\#(String(repeating: "t", count: 8193))"}"#] {
            let e = fail(text)
            XCTAssertEqual(e?.ref, "c4", text.prefix(60).description)
            XCTAssertEqual(e?.error.code, .badRequest)
            XCTAssertEqual(e?.isHello, false)
            XCTAssertEqual(e?.missingToken, false)
        }
    }

    func testPing() {
        XCTAssertEqual(ok(#"{"type":"ping","ref":"c5"}"#), .ping(ref: "c5"))
        XCTAssertEqual(ok(#"{"type":"ping"}"#), .ping(ref: nil))
        XCTAssertEqual(ok(#"{"ref":"c5","type":"ping"}"#), .ping(ref: "c5"), "key order does not matter")
        XCTAssertEqual(ok(#"{"type":"ping","ref":null}"#), .ping(ref: nil))
        XCTAssertEqual(fail(#"{"type":"ping","ref":"c5","x":1}"#)?.ref, "c5")
    }

    func testRefIsEchoedOnErrors() {
        XCTAssertEqual(fail(#"{"type":"nope","ref":"r1"}"#)?.ref, "r1")
        XCTAssertEqual(fail(#"{"type":"update","ref":"r2"}"#)?.ref, "r2")
        XCTAssertNil(fail(#"{"type":"update"}"#)?.ref)
        XCTAssertNil(fail(#"{"type":"update","ref":7}"#)?.ref, "a non-string ref cannot be echoed")
        XCTAssertEqual(fail(#"{"type":"ping","ref":"\#(String(repeating: "r", count: 257))"}"#)?.error.code, .badRequest)
        XCTAssertEqual(ok(#"{"type":"ping","ref":"\#(String(repeating: "r", count: 256))"}"#),
                       .ping(ref: String(repeating: "r", count: 256)))
    }

    func testUnknownOrMissingType() {
        for text in [#"{"type":"nope","ref":"r"}"#, #"{"type":"Hello","token":"t","deviceId":"d"}"#, #"{"type":"","ref":"r"}"#,
                     #"{"ref":"r"}"#, #"{"type":5,"ref":"r"}"#, #"{"type":null}"#, "{}",
                     #"{"type":"\#(String(repeating: "x", count: 40))"}"#] {
            let e = fail(text)
            XCTAssertEqual(e?.error.code, .badRequest, text)
            XCTAssertEqual(e?.isHello, false, text)
            XCTAssertEqual(e?.missingToken, false, text)
        }
    }

    func testNonObjectMessages() {
        for v: JSON in [[], [["type": "ping"]], "ping", 5, true, nil] {
            let e = fail(v.encodedString)
            XCTAssertEqual(e?.error.code, .badRequest)
            XCTAssertNil(e?.ref)
            XCTAssertEqual(e?.isHello, false)
        }
    }
}
