import Foundation
import HeraldCurl
import HeraldHTTP2
import XCTest

/// HTTP2Client against tls_test_server.py over real sockets: multiplexing,
/// PINGs on an idle connection and what replaces a dead one, GOAWAY, the
/// limits it shares with CurlClient.
final class HTTP2ClientTests: TLSServerTestCase {
    func client(name: String = "h2-test", caFile: String? = nil, maxInFlight: Int = 1000, maxResponseBytes: Int = 64 * 1024,
                pingInterval: Duration = .seconds(60)) throws -> HTTP2Client {
        let c = try HTTP2Client(name: name, caFile: caFile ?? ca, maxInFlight: maxInFlight, maxResponseBytes: maxResponseBytes,
                                pingInterval: pingInterval)
        clients.append(c)
        return c
    }

    /// `r`'s status, or its failure, as one string.
    static func outcome(_ r: Result<CurlResponse, CurlFailure>) -> String {
        switch r {
        case .success(let answer): "\(answer.status)"
        case .failure(let failure): "\(failure)"
        }
    }

    func testARequestAndItsAnswerOverHTTP2() throws {
        let c = try client(name: "herald-h2-t")
        let done = DispatchSemaphore(value: 0)
        let seen = LockedBox<(Result<CurlResponse, CurlFailure>?, String)>((nil, ""))
        c.send(request("/echo?q=1", headers: [("x-test", "1"), ("x-empty", ""), ("Content-Type", "application/json")])) { r in
            seen.set((r, currentThreadName()))
            done.signal()
        }
        XCTAssertEqual(done.wait(timeout: .now() + 30), .success)
        let (result, thread) = seen.get()
        let r = try XCTUnwrap(result)
        XCTAssertEqual(try r.get().status, 200)
        XCTAssertEqual(try r.get().httpVersion, 2)
        XCTAssertEqual(try r.get().headers["x-echo"], "yes")
        let echo = try json(r)
        XCTAssertEqual(echo["protocol"] as? String, "h2")
        XCTAssertEqual(echo["method"] as? String, "POST")
        XCTAssertEqual(echo["path"] as? String, "/echo?q=1")
        let headers = try XCTUnwrap(echo["headers"] as? [String: String])
        XCTAssertEqual(headers["x-test"], "1")
        XCTAssertEqual(headers["x-empty"], "", "an empty value is sent, not dropped")
        XCTAssertEqual(headers["content-type"], "application/json")
        XCTAssertEqual(echo["bodyLength"] as? Int, 7)
        XCTAssertEqual(thread, "herald-h2-t", "completions run on the client's thread, which bears its name")

        let rs = try sendAll(c, [request("/echo", method: "GET", body: ""), request("/echo", method: "PUT"),
                                 request("/echo", method: "DELETE", body: "")])
        XCTAssertEqual(try rs.map { try json($0)["method"] as? String }, ["GET", "PUT", "DELETE"])
        XCTAssertEqual(try rs.map { try json($0)["bodyLength"] as? Int }, [0, 7, 0])
        let status = try send(c, request("/status/429")).get()
        XCTAssertEqual(status.status, 429)
        XCTAssertEqual(status.headers["retry-after"], "7")
        XCTAssertEqual(String(decoding: status.body, as: UTF8.self), #"{"reason":"Scripted"}"#)
    }

    func testManyConcurrentRequestsShareOneConnection() throws {
        let c = try client()
        // More than the server's 100 concurrent streams: the rest wait for a stream, not for another connection.
        let rs = try sendAll(c, Array(repeating: request("/echo"), count: 300))
        XCTAssertEqual(rs.map { (try? $0.get().status) ?? -1 }, Array(repeating: 200, count: 300))
        XCTAssertEqual(Set(try rs.map { try json($0)["connection"] as? Int }), [1])
        XCTAssertEqual(try connectionsAccepted(c), 1, "every stream on one connection")
    }

    func testAnIdleConnectionIsPingedAndKeptForTheNextRequest() throws {
        let interval = Duration.milliseconds(300)
        let c = try client(pingInterval: interval)
        XCTAssertEqual(try json(send(c, request("/echo")))["connection"] as? Int, 1)
        var times: [Double] = []
        for _ in 0..<4 {
            let ping = try XCTUnwrap(nextEvent("ping"), "an idle connection is sent PINGs")
            XCTAssertEqual(ping["connection"] as? Int, 1)
            times.append(try XCTUnwrap(ping["at"] as? Double))
        }
        let gaps = zip(times.dropFirst(), times).map { $0 - $1 }
        print("PING gaps at a 0.3 s interval: \(gaps.map { String(format: "%.3f", $0) })")
        for gap in gaps { XCTAssertGreaterThanOrEqual(gap, 0.25, "one PING per interval, not more") }
        XCTAssertEqual(try json(send(c, request("/echo")))["connection"] as? Int, 1, "the idle connection is taken again")
        XCTAssertEqual(try connectionsAccepted(c), 1)
    }

    func testAConnectionWhosePingGoesUnansweredIsReplaced() throws {
        let c = try client(pingInterval: .milliseconds(300))
        XCTAssertEqual(try send(c, request("/deaf")).get().status, 200)
        // The server answers nothing after /deaf: the client's PING goes unanswered and it closes the connection.
        XCTAssertNotNil(nextEvent("ping"))
        let closed = try XCTUnwrap(nextEvent("closed"), "the client closes a connection whose PING goes unanswered")
        XCTAssertEqual(closed["connection"] as? Int, 1)
        XCTAssertEqual(try json(send(c, request("/echo")))["connection"] as? Int, 2, "the next request opens another")
    }

    func testStreamsAGoAwayLeftUnprocessedGoAgainOnANewConnection() throws {
        let c = try client()
        let rs = try sendAll(c, [request("/hang")] + [request("/goaway")] + Array(repeating: request("/echo"), count: 5))
        XCTAssertEqual(rs[0].failure, .other("the server sent GOAWAY"), "a stream the server took fails")
        XCTAssertEqual(try rs[1].get().status, 200)
        XCTAssertEqual(Set(try rs[2...].map { try json($0)["connection"] as? Int }), [2], "the rest are sent again, on a new connection")
    }

    func testAHungRequestTimesOutAndTheConnectionStays() throws {
        let c = try client()
        let hung = DispatchSemaphore(value: 0)
        let result = LockedBox<Result<CurlResponse, CurlFailure>?>(nil)
        c.send(request("/hang", timeout: .seconds(2))) { result.set($0); hung.signal() }
        for _ in 0..<5 { XCTAssertEqual(try send(c, request("/echo")).get().status, 200) }
        XCTAssertEqual(hung.wait(timeout: .now() + 30), .success)
        XCTAssertEqual(result.get()?.failure, .timedOut)
        XCTAssertEqual(try connectionsAccepted(c), 1, "the stream ended, not the connection")
    }

    func testARequestThatMustStartInTimeIsGivenBackUnsentOrHasItsWholeTimeoutOnTheWire() throws {
        let c = try client(maxInFlight: 1)
        let order = LockedBox<[String]>([])
        let took = LockedBox<[String: Duration]>([:])
        let done = DispatchGroup()
        let began = ContinuousClock.now
        for (name, path, startWithin) in [("first", "/hang", nil), ("late", "/echo", 1), ("next", "/hang", 10)] as [(String, String, Int?)] {
            done.enter()
            var r = request(path, timeout: .seconds(2))
            r.startWithin = startWithin.map { .seconds($0) }
            c.send(r) { result in
                order.update { $0.append("\(name) \(Self.outcome(result))") }
                took.update { $0[name] = .now - began }
                done.leave()
            }
        }
        XCTAssertEqual(done.wait(timeout: .now() + 30), .success)
        XCTAssertEqual(order.get(), ["first timed out", "late not sent: no room on the wire in time", "next timed out"])
        XCTAssertGreaterThanOrEqual(try XCTUnwrap(took.get()["next"]), .milliseconds(3_900), "its timeout counted from its start")
        XCTAssertEqual(c.inFlight, 0)
        XCTAssertEqual(c.waiting, 0)
    }

    func testLongAnswersAreRefusedAndTheConnectionStays() throws {
        let c = try client(maxResponseBytes: 8 * 1024)
        for path in ["/big", "/big-stream", "/big-headers"] {
            XCTAssertEqual(try send(c, request(path)).failure, .tooLarge, path)
        }
        XCTAssertEqual(try connectionsAccepted(c), 1)
        let roomy = try client(maxResponseBytes: 1 << 20)
        XCTAssertEqual(try send(roomy, request("/big-stream")).get().body.count, 200 * 1024)
        XCTAssertEqual(try send(roomy, request("/big-headers")).get().headers["x-filler-11"]?.count, 1024)
    }

    func testOnlyWellFormedHTTPSRequestsAreSentAndRedirectsAreNotFollowed() throws {
        let c = try client()
        XCTAssertEqual(try send(c, request("/echo", scheme: "http")).failure, .refused("only https URLs are sent to"))
        XCTAssertEqual(try send(c, request("/echo", scheme: "ftp")).failure, .refused("only https URLs are sent to"))
        guard case .refused = try send(c, request("/echo", headers: [("x-a", "1\r\nx-b: 2")])).failure else {
            return XCTFail("a line break in a header value is refused")
        }
        guard case .refused = try send(c, request("/echo", headers: [("x-a", "1\0")])).failure else {
            return XCTFail("a NUL in a header value is refused")
        }
        guard case .refused = try send(c, request("/echo", method: "GET /other")).failure else {
            return XCTFail("a method that is not a token is refused")
        }
        let r = try send(c, request("/redirect")).get()
        XCTAssertEqual(r.status, 302, "the redirect is the answer")
        XCTAssertEqual(r.headers["location"], "https://127.0.0.1:\(port)/echo")
        XCTAssertEqual(try connectionsAccepted(c), 1, "nothing connected for the refused requests")
    }

    func testTheServerMustProveItsNameWithACertificateTheCAVouchesFor() throws {
        guard case .tls = try send(try client(caFile: otherCa), request("/echo")).failure else {
            return XCTFail("a CA that does not vouch for the server: a TLS failure")
        }
        // The certificate names 127.0.0.1, not localhost.
        let wrongName = CurlRequest(method: "GET", url: "https://localhost:\(port)/echo", headers: [], body: [], timeout: .seconds(10))
        guard case .tls = try send(try client(), wrongName).failure else { return XCTFail("a name the certificate lacks: a TLS failure") }
        let nobody = CurlRequest(method: "GET", url: "https://127.0.0.1:1/echo", headers: [], body: [], timeout: .seconds(10))
        guard case .connect = try send(try client(), nobody).failure else { return XCTFail("a refused connection fails .connect") }
    }

    func testShutdownEndsWhatIsInFlightOrWaiting() throws {
        let c = try client(maxInFlight: 3)
        let results = LockedBox<[Result<CurlResponse, CurlFailure>]>([])
        let hang = { c.send(self.request("/hang", timeout: .seconds(60))) { r in results.update { $0.append(r) } } }
        hang()
        XCTAssertEqual(try send(c, request("/echo")).get().status, 200)
        XCTAssertEqual(c.inFlight, 1, "the hung request is on the wire")
        for _ in 0..<4 { hang() }  // two more on the wire, two waiting
        c.shutdown()
        XCTAssertEqual(results.get().map(\.failure), Array(repeating: .stopped, count: 5), "all complete before shutdown returns")
        XCTAssertEqual(c.inFlight, 0)
        XCTAssertEqual(c.waiting, 0)
        XCTAssertEqual(try send(c, request("/echo")).failure, .stopped, "a stopped client sends nothing")
        c.shutdown()
    }

    func testAClientCanBeStoppedFromItsOwnCompletion() throws {
        let c = try client()
        let hung = DispatchSemaphore(value: 0)
        let result = LockedBox<Result<CurlResponse, CurlFailure>?>(nil)
        c.send(request("/hang", timeout: .seconds(60))) { result.set($0); hung.signal() }
        let stopped = DispatchSemaphore(value: 0)
        c.send(request("/echo")) { _ in c.shutdown(); stopped.signal() }
        XCTAssertEqual(stopped.wait(timeout: .now() + 30), .success, "shutdown does not wait for the thread it runs on")
        XCTAssertEqual(hung.wait(timeout: .now() + 30), .success)
        XCTAssertEqual(result.get()?.failure, .stopped)
    }

    func testAClientLetGoStopsItsThread() throws {
        let hung = DispatchSemaphore(value: 0)
        let result = LockedBox<Result<CurlResponse, CurlFailure>?>(nil)
        do {
            let c = try HTTP2Client(name: "let-go", caFile: ca, maxInFlight: 10)
            c.send(request("/hang", timeout: .seconds(60))) { result.set($0); hung.signal() }
            XCTAssertEqual(try send(c, request("/echo")).get().status, 200)
        }
        XCTAssertEqual(hung.wait(timeout: .now() + 30), .success, "the last reference's release stops the client")
        XCTAssertEqual(result.get()?.failure, .stopped)
    }
}
