import XCTest
import HeraldCore
@testable import HeraldGateway
@testable import HeraldTransport

/// A real HTTPConnection on a socket in memory, with a real gateway behind
/// it: bytes in, bytes out, deadlines fired by moving the clock.
final class HTTPConnectionTests: XCTestCase {
    private func syncPoll(_ h: TransportHarness, _ user: String, wait: Int) -> [UInt8] {
        request("GET", "/v1/me/sync?cursor=0&wait=\(wait)", headers: [("Authorization", "Bearer \(h.token(user))")])
    }

    /// `s` got one answer, `status`, the last on the connection: it says
    /// `Connection: close` and our side is shut after it.
    @discardableResult
    private func assertLastAnswer(_ s: MemorySocket, _ status: Int, file: StaticString = #filePath, line: UInt = #line) -> Answer? {
        let a = answers(s.clientReads(), file: file, line: line)
        XCTAssertEqual(a.map(\.status), [status], file: file, line: line)
        XCTAssertEqual(a.first?.closes, true, "Connection: close", file: file, line: line)
        XCTAssertTrue(s.writeShut, "our side shut", file: file, line: line)
        return a.first
    }

    // MARK: Pipelining

    func testPipelinedRequestsAreAnsweredInOrder() {
        let h = TransportHarness()
        let s = h.connect()
        s.clientSends(healthz + publish("u", "a") + publish("u", "b") + healthz)
        h.settle(s)
        let a = answers(s.clientReads())
        XCTAssertEqual(a.map(\.status), [200, 201, 201, 200])
        XCTAssertEqual(a[0].json?["status"]?.stringValue, "ok")
        let published = a[1...2].map { $0.json!["notification"]!.objectValue!["appNotificationId"]!.stringValue! }
        XCTAssertEqual(published, ["a", "b"])
        XCTAssertLessThan(a[1].json!["seq"]!.int64Value!, a[2].json!["seq"]!.int64Value!)
        XCTAssertFalse(s.isClosed)
    }

    /// A held poll answers late; what is pipelined behind it waits, not
    /// even dispatched, and its answers follow the poll's in order.
    func testRequestsBehindASlowAnswerWaitTheirTurn() {
        let h = TransportHarness()
        let s = h.connect()
        s.clientSends(syncPoll(h, "u", wait: 2) + publish("u", "a") + healthz)
        h.settle(s)
        XCTAssertEqual(s.unread, [], "nothing before the poll's answer")
        XCTAssertFalse(h.stored("u", "a"), "the publish behind the poll is not dispatched yet")
        h.advance(millis: 1999, s); h.settle(s)
        XCTAssertEqual(s.unread, [])
        h.advance(millis: 1, s); h.settle(s)
        let a = answers(s.clientReads())
        XCTAssertEqual(a.map(\.status), [200, 201, 200])
        XCTAssertEqual(a[0].json?["changes"], [], "the poll timed out before the publish was read")
        XCTAssertTrue(h.stored("u", "a"))
    }

    func testAPipelineArrivingByteByByteIsAnsweredAsAWhole() {
        let h = TransportHarness()
        let s = h.connect()
        for b in publish("u", "a") + healthz { s.clientSends([b]) }
        h.settle(s)
        XCTAssertEqual(answers(s.clientReads()).map(\.status), [201, 200])
    }

    /// More than a request's worth of pipelined input stops reading (the
    /// client's window closes) until the answers before it are out.
    func testALongPipelineStopsReadingUntilItsAnswersAreOut() {
        let h = TransportHarness { $0.maxBodyBytes = 1024 }
        let s = h.connect()
        let behind = 400
        s.clientSends(syncPoll(h, "u", wait: 1) + Array((0..<behind).map { _ in healthz }.joined()))
        h.settle(s)
        XCTAssertFalse(s.reading, "reading stopped")
        XCTAssertGreaterThan(s.unreadInput, 0, "the rest waits in the kernel")
        h.advance(millis: 1000, s); h.settle(s)
        XCTAssertTrue(s.reading)
        XCTAssertEqual(s.unreadInput, 0)
        let a = answers(s.clientReads())
        XCTAssertEqual(a.count, 1 + behind)
        XCTAssertTrue(a.allSatisfy { $0.status == 200 })
    }

    /// A socket that takes a few bytes at a time gets each answer whole and
    /// in order: the next is not written into the middle of one.
    func testAnswersGoOutWholeThroughASocketThatTakesLittle() {
        let h = TransportHarness()
        let s = h.connect()
        s.room = 7
        s.clientSends(healthz + publish("u", "a") + healthz)
        h.settle(s)
        var got: [UInt8] = []
        while !s.unread.isEmpty { got += s.clientReads(); h.settle(s) }
        XCTAssertEqual(answers(got).map(\.status), [200, 201, 200])
    }

    // MARK: 100-continue

    func testExpectContinueIsAnsweredBeforeTheBody() {
        let h = TransportHarness()
        let s = h.connect()
        let p = publish("u", "a", headers: [("Expect", "100-continue")])
        let split = p.count - 20
        s.clientSends(Array(p[..<split]))
        h.settle(s)
        XCTAssertEqual(String(decoding: s.clientReads(), as: UTF8.self), "HTTP/1.1 100 Continue\r\n\r\n")
        XCTAssertFalse(h.stored("u", "a"))
        s.clientSends(Array(p[split...]))
        h.settle(s)
        XCTAssertEqual(answers(s.clientReads()).map(\.status), [201])
        XCTAssertTrue(h.stored("u", "a"))
    }

    func testNoContinueWhenTheBodyCameWithTheHead() {
        let h = TransportHarness()
        let s = h.connect()
        s.clientSends(publish("u", "a", headers: [("Expect", "100-continue")]))
        h.settle(s)
        XCTAssertEqual(answers(s.clientReads()).map(\.status), [201])
    }

    /// A body over the limit is refused before it is sent: 413, no 100, closed.
    func testNoContinueForABodyOverTheLimit() {
        let h = TransportHarness()
        let s = h.connect()
        let tooBig = h.gateway.config.limits.maxBodyBytes + 1
        s.clientSends(request("POST", "/v1/apps/app.test/users/u/notifications",
                              headers: [("Authorization", "Bearer sk"), ("Expect", "100-continue"), ("Content-Length", "\(tooBig)")]))
        h.settle(s)
        assertLastAnswer(s, 413)
    }

    /// A head refused as it is (here: no Host) wants no body: its answer
    /// goes at once, with no 100, and the connection closes.
    func testNoContinueForARefusedHead() {
        let h = TransportHarness()
        let s = h.connect()
        let p = request("POST", "/v1/apps/app.test/users/u/notifications",
                        headers: [("Authorization", "Bearer sk"), ("Expect", "100-continue"), ("Content-Length", "10")], host: false)
        s.clientSends(p)
        h.settle(s)
        assertLastAnswer(s, 400)
    }

    /// HTTP/1.0 knows no 100: the body just follows.
    func testNoContinueToHTTP10() {
        let h = TransportHarness()
        let s = h.connect()
        let p = request("POST", "/v1/apps/app.test/users/u/notifications", version: "HTTP/1.0",
                        headers: [("Authorization", "Bearer sk"), ("Expect", "100-continue")],
                        body: Array(#"{"appNotificationId":"a","payload":{}}"#.utf8))
        s.clientSends(Array(p[..<(p.count - 5)]))
        h.settle(s)
        XCTAssertEqual(s.unread, [])
        s.clientSends(Array(p[(p.count - 5)...]))
        h.settle(s)
        XCTAssertEqual(answers(s.clientReads()).map(\.status), [201])
    }

    // MARK: Deadlines

    func testAConnectionThatSendsNothingIsClosedAtTheRequestTimeout() {
        let h = TransportHarness { $0.requestTimeoutSeconds = 3 }
        let s = h.connect()
        h.advance(millis: 2999, s)
        XCTAssertFalse(s.isClosed)
        h.advance(millis: 1, s)
        XCTAssertTrue(s.isClosed)
        XCTAssertEqual(s.unread, [], "closed unanswered")
    }

    func testAnIdleKeptAliveConnectionClosesAfterTheKeepAlive() {
        let h = TransportHarness()
        let s = h.connect()
        s.clientSends(healthz)
        h.settle(s)
        XCTAssertEqual(answers(s.clientReads()).map(\.status), [200])
        h.advance(millis: Int64(HTTPConnection.keepAliveSeconds) * 1000 - 1, s)
        XCTAssertFalse(s.isClosed)
        // A request now is answered, and the wait starts again after it.
        s.clientSends(healthz)
        h.settle(s)
        XCTAssertEqual(answers(s.clientReads()).map(\.status), [200])
        h.advance(millis: Int64(HTTPConnection.keepAliveSeconds) * 1000 - 1, s)
        XCTAssertFalse(s.isClosed)
        h.advance(millis: 1, s)
        XCTAssertTrue(s.isClosed)
    }

    /// Slowloris: a head trickling in is cut at the request timeout from its
    /// first byte, however often bytes come.
    func testAHeadTricklingInIsCutAtItsDeadline() {
        let h = TransportHarness { $0.requestTimeoutSeconds = 3 }
        let s = h.connect()
        s.clientSends(healthz)
        h.settle(s)
        s.clientReads()
        h.advance(millis: 1000, s)  // kept alive: the next request's clock starts at its first byte
        s.clientSends(Array("GET /healthz HTTP/1.1\r\n".utf8))
        for i in 0..<29 {
            h.advance(millis: 100, s)
            s.clientSends(Array("X-Slow-\(i): 1\r\n".utf8))
        }
        h.advance(millis: 99, s)
        XCTAssertFalse(s.isClosed)
        h.advance(millis: 1, s)
        XCTAssertTrue(s.isClosed)
        XCTAssertEqual(s.unread, [])
    }

    func testABodyTricklingInIsCutAtItsDeadline() {
        let h = TransportHarness { $0.requestTimeoutSeconds = 2 }
        let s = h.connect()
        let p = publish("u", "a")
        s.clientSends(Array(p[..<(p.count - 10)]))
        for b in p[(p.count - 10)..<(p.count - 1)] {
            h.advance(millis: 200, s)
            s.clientSends([b])
        }
        h.advance(millis: 200, s)
        XCTAssertTrue(s.isClosed, "cut 2 s after its first byte, one byte short")
        h.settle(s)
        XCTAssertFalse(h.stored("u", "a"))
    }

    /// The request timeout covers reading a request, not waiting for its answer.
    func testAHeldPollOutlivesTheRequestTimeout() {
        let h = TransportHarness { $0.requestTimeoutSeconds = 1 }
        let s = h.connect()
        s.clientSends(syncPoll(h, "u", wait: 5))
        h.settle(s)
        h.advance(millis: 4999, s); h.settle(s)
        XCTAssertFalse(s.isClosed)
        h.advance(millis: 1, s); h.settle(s)
        XCTAssertEqual(answers(s.clientReads()).map(\.status), [200])
    }

    /// An answer waiting for a socket that takes nothing.
    private func answerInAFullSocket(writeTimeoutSeconds: Int) -> (TransportHarness, MemorySocket) {
        let h = TransportHarness { $0.writeTimeoutSeconds = writeTimeoutSeconds }
        let s = h.connect()
        s.room = 0
        s.clientSends(healthz)
        h.settle(s)
        return (h, s)
    }

    /// Slow read: an answer the socket takes none of for the write timeout
    /// closes the connection, counted as a slow consumer.
    func testAClientThatReadsNothingIsCutAtTheWriteTimeout() {
        let (h, s) = answerInAFullSocket(writeTimeoutSeconds: 2)
        h.advance(millis: 1999, s)
        XCTAssertFalse(s.isClosed)
        h.advance(millis: 1, s)
        XCTAssertTrue(s.isClosed)
        XCTAssertEqual(h.slowConsumerDrops, 1)
    }

    /// Every byte the socket takes moves the write deadline on.
    func testASlowReaderThatKeepsReadingIsNotCut() {
        let (h, s) = answerInAFullSocket(writeTimeoutSeconds: 2)
        var got: [UInt8] = []
        for _ in 0..<40 {
            h.advance(millis: 1500, s)
            XCTAssertFalse(s.isClosed)
            s.room = 3
            s.service()
            got += s.clientReads()
            s.room = 0
            if case (let a, partial: false) = parseAnswers(got), a.count == 1 { break }
        }
        XCTAssertEqual(answers(got).map(\.status), [200])
        XCTAssertFalse(s.isClosed)
    }

    // MARK: Closing and half-close

    /// After an answer with `Connection: close` our side is shut: the
    /// client reads the end of the stream, what it sends is dropped
    /// unanswered, and the connection closes when it does, or after the
    /// linger.
    func testConnectionCloseShutsOurSideThenLingers() {
        let h = TransportHarness()
        let s = h.connect()
        s.clientSends(request("GET", "/healthz", headers: [("Connection", "close")]) + healthz)
        h.settle(s)
        assertLastAnswer(s, 200)  // the request after it is not answered
        XCTAssertFalse(s.isClosed, "lingering, reading")
        s.clientSends(healthz)
        h.settle(s)
        XCTAssertEqual(s.unread, [])
        h.advance(millis: Int64(HTTPConnection.lingerSeconds) * 1000 - 1, s)
        XCTAssertFalse(s.isClosed)
        h.advance(millis: 1, s)
        XCTAssertTrue(s.isClosed)
    }

    /// A client that closes while its answer is pending releases what held it.
    func testAClientClosingUnderAHeldPollReleasesIt() {
        let h = TransportHarness()
        let s = h.connect()
        s.clientSends(syncPoll(h, "u", wait: 30))
        h.settle(s)
        XCTAssertEqual(h.gateway.heldPolls.load(ordering: .relaxed), 1)
        s.close()
        s.service()
        h.settle(s)
        XCTAssertEqual(h.gateway.heldPolls.load(ordering: .relaxed), 0)
        XCTAssertTrue(h.loop.httpConnections.isEmpty)
    }

    /// The loop keeps no connection that closed, whatever deadlines it had.
    func testAClosedConnectionIsLetGo() {
        let h = TransportHarness()
        let s = h.connect()
        weak let conn = s.connection as? HTTPConnection
        s.clientSends(healthz + Array("GET /healthz".utf8))  // kept alive, a request begun
        h.settle(s)
        s.close()
        s.service()
        XCTAssertNil(conn)
        XCTAssertTrue(h.loop.httpConnections.isEmpty)
    }

    func testHTTP10WithoutKeepAliveClosesAfterItsAnswer() {
        let h = TransportHarness()
        let s = h.connect()
        s.clientSends(request("GET", "/healthz", version: "HTTP/1.0", host: false))
        h.settle(s)
        assertLastAnswer(s, 200)
    }

    func testHTTP10KeepAliveCarriesTheNextRequest() {
        let h = TransportHarness()
        let s = h.connect()
        s.clientSends(request("GET", "/healthz", version: "HTTP/1.0", headers: [("Connection", "keep-alive")], host: false)
                      + request("GET", "/healthz", version: "HTTP/1.0", host: false))
        h.settle(s)
        let a = answers(s.clientReads())
        XCTAssertEqual(a.map(\.status), [200, 200])
        XCTAssertEqual(a.map(\.closes), [false, true])
        XCTAssertEqual(a.first?.headers["connection"], "keep-alive", "HTTP/1.0 closes unless told it is kept")
    }

    /// An event stream to HTTP/1.0 goes raw (no chunks, which it knows not),
    /// ended by closing.
    func testAnEventStreamToHTTP10IsNotChunked() {
        let h = TransportHarness()
        let s = h.connect()
        s.clientSends(request("GET", "/v1/me/events?cursor=0", version: "HTTP/1.0", headers: [("Authorization", "Bearer \(h.token("u"))")],
                              host: false))
        h.settle(s)
        let head = String(decoding: s.clientReads(), as: UTF8.self)
        XCTAssertTrue(head.hasPrefix("HTTP/1.1 200 "), head)
        XCTAssertFalse(head.lowercased().contains("transfer-encoding"), head)
        let p = h.connect()  // a server publishes on its own connection
        p.clientSends(publish("u", "a"))
        h.settle(s, p)
        let event = String(decoding: s.clientReads(), as: UTF8.self)
        XCTAssertTrue(event.contains("event: "), event)
        XCTAssertFalse(event.hasPrefix("0") || event.contains("\r\n"), "no chunk framing: \(event)")
    }

    /// An event stream with nothing to send has no deadline; one whose
    /// client stopped reading is cut at the write timeout, as a slow consumer.
    func testAnEventStreamIsCutOnlyWhenItsOutputWaits() {
        let h = TransportHarness { $0.writeTimeoutSeconds = 2 }
        let s = h.connect()
        s.clientSends(request("GET", "/v1/me/events?cursor=0", headers: [("Authorization", "Bearer \(h.token("u"))")]))
        h.settle(s)
        XCTAssertTrue(String(decoding: s.clientReads(), as: UTF8.self).contains("Transfer-Encoding: chunked"))
        for _ in 0..<30 { h.advance(millis: 1000, s); h.settle(s); s.clientReads() }
        XCTAssertFalse(s.isClosed, "idle for 30 s")
        s.room = 0
        let p = h.connect()
        p.clientSends(publish("u", "a"))
        h.settle(s, p)
        h.advance(millis: 1999, s)
        XCTAssertFalse(s.isClosed)
        h.advance(millis: 1, s)
        XCTAssertTrue(s.isClosed)
        XCTAssertEqual(h.slowConsumerDrops, 1)
    }

    // MARK: Limits and refusals

    func testAHeadOverTheLimitIs413AndCloses() {
        let h = TransportHarness()
        let s = h.connect()
        s.clientSends(Array("GET /healthz HTTP/1.1\r\nX-Big: ".utf8) + [UInt8](repeating: UInt8(ascii: "a"), count: HTTPWire.maxHead))
        h.settle(s)
        assertLastAnswer(s, 413)
    }

    func testABodyOverTheLimitIs413AndNothingIsStored() {
        let h = TransportHarness { $0.maxBodyBytes = 100 }
        let s = h.connect()
        let body = Array(#"{"appNotificationId":"a","payload":{"body":"\#(String(repeating: "x", count: 100))"}}"#.utf8)
        s.clientSends(request("POST", "/v1/apps/app.test/users/u/notifications", headers: [("Authorization", "Bearer sk")], body: body))
        h.settle(s)
        assertLastAnswer(s, 413)
        XCTAssertFalse(h.stored("u", "a"))
    }

    func testAChunkedRequestBodyIs400AndCloses() {
        let h = TransportHarness()
        let s = h.connect()
        s.clientSends(request("POST", "/v1/apps/app.test/users/u/notifications",
                              headers: [("Authorization", "Bearer sk"), ("Transfer-Encoding", "chunked")])
                      + Array("5\r\nhello\r\n0\r\n\r\n".utf8))
        h.settle(s)
        let a = assertLastAnswer(s, 400)
        XCTAssertTrue(String(decoding: a?.body ?? [], as: UTF8.self).contains("chunked"))
    }

    func testAMalformedRequestLineIs400AndCloses() {
        let h = TransportHarness()
        let s = h.connect()
        s.clientSends(Array("HELLO\r\n\r\n".utf8) + healthz)
        h.settle(s)
        assertLastAnswer(s, 400)
    }

    /// A request refused for its query is well framed: the connection goes on.
    func testARefusedButWellFramedRequestKeepsTheConnection() {
        let h = TransportHarness()
        let s = h.connect()
        s.clientSends(request("GET", "/healthz?x=%zz") + healthz)
        h.settle(s)
        let a = answers(s.clientReads())
        XCTAssertEqual(a.map(\.status), [400, 200])
        XCTAssertFalse(a[0].closes)
    }

    func testAConnectionPastTheCapIsAnswered503AndClosed() {
        let h = TransportHarness(cap: 1)
        let first = h.connect(), second = h.connect()
        second.clientSends(healthz)
        first.clientSends(healthz)
        h.settle(first, second)
        XCTAssertEqual(assertLastAnswer(second, 503)?.headers["retry-after"], "5")
        XCTAssertEqual(answers(first.clientReads()).map(\.status), [200])
    }

    func testAnAnswerToHEADHasNoBodyAndTheConnectionGoesOn() {
        let h = TransportHarness()
        let s = h.connect()
        s.clientSends(request("HEAD", "/healthz") + healthz)
        h.settle(s)
        let bytes = s.clientReads()
        let head = parseAnswers(bytes, head: true).0[0]
        XCTAssertEqual(head.status, 200, "HEAD is GET without the body")
        let length = Int(head.headers["content-length"]!)!
        XCTAssertGreaterThan(length, 0)
        let headEnd = String(decoding: bytes, as: UTF8.self).range(of: "\r\n\r\n")!.upperBound
        let rest = Array(String(decoding: bytes, as: UTF8.self)[headEnd...].utf8)
        XCTAssertEqual(answers(rest).map(\.status), [200], "the next answer follows the head at once")
    }

    // MARK: WebSocket hand-off

    /// A WebSocket handshake hands the socket over with its `101` and the
    /// bytes that came behind it; the HTTP connection is done with it.
    func testAnUpgradeHandsTheSocketToAWebSocket() {
        let h = TransportHarness()
        let s = h.connect()
        let frame: [UInt8] = [0x81, 0x80, 1, 2, 3, 4]  // an empty masked text frame
        s.clientSends(request("GET", "/v1/ws", headers: [("Upgrade", "websocket"), ("Connection", "Upgrade"),
                                                         ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
                                                         ("Sec-WebSocket-Version", "13"), ("Origin", "https://app.test")]) + frame)
        h.settle(s)
        let up = try! XCTUnwrap(s.upgrade)
        let handshake = String(decoding: up.handshake, as: UTF8.self)
        XCTAssertTrue(handshake.hasPrefix("HTTP/1.1 101 "), handshake)
        XCTAssertTrue(handshake.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo="), handshake)  // RFC 6455 1.3
        XCTAssertEqual(up.origin, "https://app.test")
        XCTAssertEqual(up.early, frame)
        XCTAssertEqual(s.unread, [], "the WebSocket writes the handshake")
        XCTAssertTrue(h.loop.httpConnections.isEmpty)
        h.advance(millis: 60_000, s)
        XCTAssertFalse(s.isClosed, "no HTTP deadline follows the socket")
    }

    func testAnUpgradeWithoutAKeyIsRefused() {
        let h = TransportHarness()
        let s = h.connect()
        s.clientSends(request("GET", "/v1/ws", headers: [("Upgrade", "websocket"), ("Connection", "Upgrade"), ("Sec-WebSocket-Version", "13")]))
        h.settle(s)
        XCTAssertNil(s.upgrade)
        assertLastAnswer(s, 400)
    }

    // MARK: Shutdown

    /// At shutdown an idle connection closes at once; one owing an answer
    /// gives it, with `Connection: close`.
    func testShutdownClosesIdleConnectionsAndAnswersBusyOnes() {
        let h = TransportHarness()
        let idle = h.connect(), busy = h.connect()
        idle.clientSends(healthz)
        busy.clientSends(syncPoll(h, "u", wait: 30))
        h.settle(idle, busy)
        idle.clientReads()
        h.loop.beginShutdown()
        h.settle(idle, busy)
        XCTAssertTrue(idle.isClosed)
        assertLastAnswer(busy, 200)
        XCTAssertEqual(h.loop.openConnections, 0)
    }
}
