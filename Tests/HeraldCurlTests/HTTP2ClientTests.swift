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

    func testHTTP2CarriesMethodHeadersAndBodyBothWays() throws {
        let c = try client(name: "herald-test-t")
        try checkHTTP2CarriesMethodHeadersAndBodyBothWays(c)
        let rs = try sendAll(c, [request("/echo", method: "GET", body: ""), request("/echo", method: "PUT"),
                                 request("/echo", method: "DELETE", body: "")])
        XCTAssertEqual(try rs.map { try json($0)["method"] as? String }, ["GET", "PUT", "DELETE"])
        XCTAssertEqual(try rs.map { try json($0)["bodyLength"] as? Int }, [0, 7, 0])
    }

    func testStatusAndRetryAfterPassThrough() throws { try checkStatusAndRetryAfterPassThrough(client()) }

    func testManyConcurrentRequestsShareOneConnection() throws { try checkManyConcurrentRequestsShareOneConnection(client()) }

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

    /// A request that times out on a busy connection is followed by a
    /// PING at once, not an idle interval later: a peer gone silent under
    /// steady traffic is found within the PING's timeout, where it would
    /// otherwise be written to until TCP gave up, minutes later.
    func testAStreamThatTimesOutIsFollowedByAPing() throws {
        let c = try client(pingInterval: .seconds(60))
        XCTAssertEqual(try send(c, request("/deaf")).get().status, 200)
        XCTAssertEqual(try send(c, request("/echo", timeout: .milliseconds(300))).failure, .timedOut)
        let ping = try XCTUnwrap(nextEvent("ping", timeout: .seconds(20)), "a PING follows the timed-out stream, long before 60 s")
        XCTAssertEqual(ping["connection"] as? Int, 1)
    }

    /// An address whose connect never completes (its accept queue full, so
    /// SYNs are dropped, as on a blackholed route) is given up after 5 s
    /// for the next; with none left the request fails `.connect`, long
    /// before its own 20 s.
    func testAnAddressThatNeverAcceptsIsGivenUpAfterFiveSeconds() throws {
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, length) == 0 && getsockname(listener, $0, &length) == 0 }
        }
        XCTAssertTrue(bound)
        XCTAssertEqual(listen(listener, 0), 0)
        // Fill its accept queue (never accepted): the next SYN is dropped.
        let fillers = (0..<3).map { _ in socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0) }
        for f in fillers {
            _ = withUnsafePointer(to: &address) { p in
                p.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(f, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
        }
        defer { for fd in fillers + [listener] { close(fd) } }
        let c = try client()
        let url = "https://127.0.0.1:\(UInt16(bigEndian: address.sin_port))/echo"
        let r = try send(c, CurlRequest(method: "GET", url: url, headers: [], body: [], timeout: .seconds(20)))
        guard case .connect(let why) = r.failure else { return XCTFail("\(r)") }
        XCTAssertTrue(why.contains("no connection within 5"), why)
    }

    /// A connection whose stream ids are used up (2^31 - 1 is the last) is
    /// retired: the request that found none goes on a new connection, and
    /// the old one closes.
    func testAConnectionOutOfStreamIdsIsReplaced() throws {
        let c = try HTTP2Client(name: "h2-test", caFile: ca, maxInFlight: 10, firstStreamID: Int32.max - 2)
        clients.append(c)
        var on: [Int?] = []
        for _ in 0..<3 { on.append(try json(send(c, request("/echo")))["connection"] as? Int) }
        XCTAssertEqual(on, [1, 1, 2], "streams 2^31 - 3 and 2^31 - 1 on the first connection, then a new one")
        XCTAssertEqual(try XCTUnwrap(nextEvent("closed"))["connection"] as? Int, 1, "the retired connection closed")
    }

    func testAConnectionTheServerClosedIsReplaced() throws {
        let c = try client()
        XCTAssertEqual(try json(send(c, request("/bye")))["connection"] as? Int, 1)
        XCTAssertEqual(try XCTUnwrap(nextEvent("closed"))["connection"] as? Int, 1, "the server closed it")
        XCTAssertEqual(try json(send(c, request("/echo")))["connection"] as? Int, 2, "the next request opens another")
    }

    /// A GOAWAY closes the connection to new streams: those it says the
    /// server did not process go again on a new connection, and those it
    /// took are answered on the old one (failing them would send them
    /// twice), which then closes.
    func testStreamsAGoAwayLeftUnprocessedGoAgainOnANewConnectionAndTheOthersAreAnswered() throws {
        let c = try client()
        let rs = try sendAll(c, [request("/held")] + [request("/goaway")] + Array(repeating: request("/echo"), count: 5))
        XCTAssertEqual(try json(rs[0])["connection"] as? Int, 1, "a stream the server took is answered after its GOAWAY")
        XCTAssertEqual(try rs[1].get().status, 200)
        XCTAssertEqual(Set(try rs[2...].map { try json($0)["connection"] as? Int }), [2], "the rest are sent again, on a new connection")
        XCTAssertEqual(try XCTUnwrap(nextEvent("closed"))["connection"] as? Int, 1, "the old connection closed once answered")
    }

    func testAHungRequestTimesOutAndTheConnectionStays() throws { try checkAHungRequestTimesOutWhileOthersComplete(client()) }

    func testARequestThatMustStartInTimeIsGivenBackUnsentOrHasItsWholeTimeoutOnTheWire() throws {
        try checkARequestThatMustStartInTimeIsGivenBackUnsentOrHasItsWholeTimeoutOnTheWire(client(maxInFlight: 1))
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
        try checkOnlyWellFormedHTTPSRequestsAreSentAndRedirectsAreNotFollowed(client())
    }

    func testTheServerMustProveItsNameWithACertificateTheCAVouchesFor() throws {
        guard case .tls = try send(try client(caFile: otherCa), request("/echo")).failure else {
            return XCTFail("a CA that does not vouch for the server: a TLS failure")
        }
        // The certificate names 127.0.0.1, not localhost.
        let wrongName = CurlRequest(method: "GET", url: "https://localhost:\(port)/echo", headers: [], body: [], timeout: .seconds(10))
        guard case .tls = try send(try client(), wrongName).failure else { return XCTFail("a name the certificate lacks: a TLS failure") }
        let http1 = CurlRequest(method: "GET", url: "https://127.0.0.1:\(http1Port)/echo", headers: [], body: [], timeout: .seconds(10))
        XCTAssertEqual(try send(try client(), http1).failure, .tls("the server did not choose h2 by ALPN (none)"))
        let nobody = CurlRequest(method: "GET", url: "https://127.0.0.1:1/echo", headers: [], body: [], timeout: .seconds(10))
        guard case .connect = try send(try client(), nobody).failure else { return XCTFail("a refused connection fails .connect") }
    }

    func testShutdownEndsWhatIsInFlightOrWaiting() throws { try checkShutdownEndsWhatIsInFlightOrWaiting(client(maxInFlight: 3)) }

    func testAClientCanBeStoppedFromItsOwnCompletion() throws { try checkAClientCanBeStoppedFromItsOwnCompletion(client()) }

    func testAClientLetGoStopsItsThread() throws {
        try checkAClientLetGoStopsItsThread { try HTTP2Client(name: "let-go", caFile: ca, maxInFlight: 10) }
    }
}
