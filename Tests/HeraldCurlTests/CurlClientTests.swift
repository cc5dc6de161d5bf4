import Foundation
import HeraldCurl
import XCTest

/// CurlClient against a real TLS server on loopback (tls_test_server.py:
/// HTTP/2 by ALPN, or HTTP/1.1), with a CA of its own. Each test has its own
/// server, so its connection count starts at zero.
final class CurlClientTests: TLSServerTestCase {
    func client(name: String = "curl-test", http2: Bool = true, caFile: String? = nil, maxInFlight: Int = 1000,
                maxResponseBytes: Int = 64 * 1024, idleLimit: Duration? = nil) throws -> CurlClient {
        let c = try CurlClient(name: name, caFile: caFile ?? ca, http2: http2, maxInFlight: maxInFlight, maxResponseBytes: maxResponseBytes,
                               idleLimit: idleLimit)
        clients.append(c)
        return c
    }

    // MARK: Tests

    func testHTTP2CarriesMethodHeadersAndBodyBothWays() throws {
        try checkHTTP2CarriesMethodHeadersAndBodyBothWays(client(name: "herald-test-t"))
    }

    func testMethodsWithAndWithoutBodies() throws {
        let c = try client()
        let rs = try sendAll(c, [request("/echo", method: "GET", body: ""), request("/echo", method: "POST", body: ""),
                                 request("/echo", method: "PUT"), request("/echo", method: "DELETE", body: "")])
        let echoes = try rs.map { try json($0) }
        XCTAssertEqual(echoes.map { $0["method"] as? String }, ["GET", "POST", "PUT", "DELETE"])
        XCTAssertEqual(echoes.map { $0["bodyLength"] as? Int }, [0, 0, 7, 0])
        XCTAssertEqual((echoes[1]["headers"] as? [String: String])?["content-length"], "0", "an empty POST is still a POST")
    }

    func testAHandleTakenAgainCarriesNothingOfItsLastRequest() throws {
        // One at a time, so that each request reuses the handle of the one before.
        let c = try client(maxInFlight: 1)
        var echoes: [[String: Any]] = []
        for r in [request("/echo", method: "PUT"), request("/echo", method: "GET", headers: [], body: ""), request("/echo"),
                  request("/echo", method: "DELETE", body: "")] {
            echoes.append(try json(send(c, r)))
        }
        XCTAssertEqual(echoes.map { $0["method"] as? String }, ["PUT", "GET", "POST", "DELETE"])
        XCTAssertEqual(echoes.map { $0["bodyLength"] as? Int }, [7, 0, 7, 0])
        XCTAssertNil((echoes[1]["headers"] as? [String: String])?["x-test"], "the last request's headers are not sent again")
        // A failure leaves nothing behind either.
        if case .success = try send(c, request("/echo", scheme: "http")) { XCTFail("http is refused") }
        XCTAssertEqual(try send(c, request("/echo")).get().status, 200)
    }

    func testManyConcurrentRequestsShareOneConnection() throws { try checkManyConcurrentRequestsShareOneConnection(client()) }

    func testTheConnectionIsKeptBetweenRequests() throws {
        for http2 in [true, false] {
            let c = try client(http2: http2)
            let first = try json(send(c, request("/echo")))
            let second = try json(send(c, request("/echo")))
            XCTAssertEqual(first["protocol"] as? String, http2 ? "h2" : "http/1.1")
            XCTAssertNotNil(first["connection"] as? Int)
            XCTAssertEqual(first["connection"] as? Int, second["connection"] as? Int, "http2: \(http2)")
        }
    }

    /// libcurl drops a connection idle over 118 s (CURLOPT_MAXAGE_CONN's
    /// default); the client keeps it however long it idles, unless given a
    /// limit. The same option with 1 s shows the limit is what curl applies,
    /// without a two-minute wait: an idle of 2.5 s (a sleep may only last
    /// longer) is past the one and well within the other.
    func testAnIdleConnectionIsTakenAgainUnlessPastTheLimitGiven() throws {
        let kept = try client(), limited = try client(idleLimit: .seconds(1))
        let before = try [kept, limited].map { try json(send($0, request("/echo")))["connection"] as? Int }
        Thread.sleep(forTimeInterval: 2.5)
        let after = try [kept, limited].map { try json(send($0, request("/echo")))["connection"] as? Int }
        XCTAssertEqual(after[0], before[0], "kept while idle")
        XCTAssertNotEqual(after[1], before[1], "past its limit, connected anew")
        XCTAssertEqual(try connectionsAccepted(kept), 3)
    }

    func testAHungRequestTimesOutWhileOthersComplete() throws { try checkAHungRequestTimesOutWhileOthersComplete(client()) }

    func testRequestsBeyondMaxInFlightWaitTheirTurnWithinTheirTimeout() throws {
        let c = try client(maxInFlight: 1)
        let order = LockedBox<[String]>([])
        let done = DispatchGroup()
        for (path, timeout) in [("/hang", 2), ("/echo", 1), ("/echo", 10)] {
            done.enter()
            c.send(request(path, timeout: .seconds(timeout))) { r in
                order.update { $0.append("\(path) \(outcome(r))") }
                done.leave()
            }
        }
        XCTAssertEqual(done.wait(timeout: .now() + 30), .success)
        // The second waited behind the first past its own deadline, so it failed without going out.
        XCTAssertEqual(order.get(), ["/hang timed out", "/echo timed out", "/echo 200"])
        XCTAssertEqual(c.inFlight, 0)
        XCTAssertEqual(c.waiting, 0)
    }

    func testARequestThatMustStartInTimeIsGivenBackUnsentOrHasItsWholeTimeoutOnTheWire() throws {
        try checkARequestThatMustStartInTimeIsGivenBackUnsentOrHasItsWholeTimeoutOnTheWire(client(maxInFlight: 1))
    }

    func testOnlyWellFormedHTTPSRequestsAreSentAndRedirectsAreNotFollowed() throws {
        try checkOnlyWellFormedHTTPSRequestsAreSentAndRedirectsAreNotFollowed(client())
    }

    func testLongAnswersAreRefused() throws {
        for http2 in [true, false] {
            let c = try client(http2: http2, maxResponseBytes: 8 * 1024)
            for path in ["/big", "/big-stream", "/big-headers"] {
                XCTAssertEqual(try send(c, request(path)).failure, .tooLarge, "\(path), http2: \(http2)")
            }
            let roomy = try client(http2: http2, maxResponseBytes: 1 << 20)
            XCTAssertEqual(try send(roomy, request("/big-stream")).get().body.count, 200 * 1024)
            XCTAssertEqual(try send(roomy, request("/big-headers")).get().headers["x-filler-11"]?.count, 1024)
        }
    }

    func testACertificateTheCADoesNotVouchForFails() throws {
        guard case .tls = try send(try client(caFile: otherCa), request("/echo")).failure else {
            return XCTFail("expected a TLS failure")
        }
    }

    func testStatusAndRetryAfterPassThrough() throws { try checkStatusAndRetryAfterPassThrough(client()) }

    func testHTTP1WhenAsked() throws {
        let r = try send(try client(http2: false), request("/echo"))
        XCTAssertEqual(try r.get().httpVersion, 1)
        XCTAssertEqual(try r.get().headers["x-echo"], "yes")
        XCTAssertEqual(try json(r)["protocol"] as? String, "http/1.1")
    }

    func testShutdownEndsWhatIsInFlightOrWaiting() throws { try checkShutdownEndsWhatIsInFlightOrWaiting(client(maxInFlight: 3)) }

    func testAClientCanBeStoppedFromItsOwnCompletion() throws { try checkAClientCanBeStoppedFromItsOwnCompletion(client()) }

    func testAClientLetGoStopsItsThread() throws {
        try checkAClientLetGoStopsItsThread { try CurlClient(name: "let-go", caFile: ca, http2: true, maxInFlight: 10) }
    }
}
