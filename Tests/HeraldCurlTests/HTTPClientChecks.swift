import Foundation
import HeraldCurl
import XCTest

/// What both clients, CurlClient and HTTP2Client, must do alike: each
/// test class runs these against its own client.
extension TLSServerTestCase {
    /// `c`'s thread is named "herald-test-t".
    func checkHTTP2CarriesMethodHeadersAndBodyBothWays(_ c: any HTTPClient) throws {
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
        XCTAssertNil(headers["expect"])
        XCTAssertEqual(echo["bodyLength"] as? Int, 7)
        #if os(Linux)
        XCTAssertEqual(thread, "herald-test-t", "completions run on the client's thread, which bears its name")
        #endif
    }

    func checkManyConcurrentRequestsShareOneConnection(_ c: any HTTPClient) throws {
        // More than the server's 100 concurrent streams: the rest wait for a stream, not for another connection.
        let rs = try sendAll(c, Array(repeating: request("/echo"), count: 300))
        XCTAssertEqual(rs.map { (try? $0.get().status) ?? -1 }, Array(repeating: 200, count: 300))
        XCTAssertEqual(Set(try rs.map { try json($0)["connection"] as? Int }), [1])
        XCTAssertEqual(try connectionsAccepted(c), 1, "every stream on one connection")
    }

    func checkAHungRequestTimesOutWhileOthersComplete(_ c: any HTTPClient) throws {
        let hung = DispatchSemaphore(value: 0)
        let result = LockedBox<Result<CurlResponse, CurlFailure>?>(nil)
        c.send(request("/hang", timeout: .seconds(2))) { result.set($0); hung.signal() }
        for _ in 0..<5 { XCTAssertEqual(try send(c, request("/echo")).get().status, 200) }
        XCTAssertEqual(hung.wait(timeout: .now() + 30), .success)
        XCTAssertEqual(result.get()?.failure, .timedOut)
        XCTAssertEqual(try connectionsAccepted(c), 1, "the stream ended, not the connection")
    }

    func checkARequestThatMustStartInTimeIsGivenBackUnsentOrHasItsWholeTimeoutOnTheWire(_ c: any HTTPClient) throws {
        let order = LockedBox<[String]>([])
        let took = LockedBox<[String: Duration]>([:])
        let done = DispatchGroup()
        let began = ContinuousClock.now
        for (name, path, startWithin) in [("first", "/hang", nil), ("late", "/echo", 1), ("next", "/hang", 10)] as [(String, String, Int?)] {
            done.enter()
            var r = request(path, timeout: .seconds(2))
            r.startWithin = startWithin.map { .seconds($0) }
            c.send(r) { result in
                order.update { $0.append("\(name) \(outcome(result))") }
                took.update { $0[name] = .now - began }
                done.leave()
            }
        }
        XCTAssertEqual(done.wait(timeout: .now() + 30), .success)
        // `late` waited behind `first` past its second: never sent. `next` started
        // as `first` timed out and had its own 2 s on the wire after that.
        XCTAssertEqual(order.get(), ["first timed out", "late not sent: no room on the wire in time", "next timed out"])
        XCTAssertGreaterThanOrEqual(try XCTUnwrap(took.get()["next"]), .milliseconds(3_900), "its timeout counted from its start")
        XCTAssertEqual(c.inFlight, 0)
        XCTAssertEqual(c.waiting, 0)
    }

    func checkOnlyWellFormedHTTPSRequestsAreSentAndRedirectsAreNotFollowed(_ c: any HTTPClient) throws {
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

    func checkStatusAndRetryAfterPassThrough(_ c: any HTTPClient) throws {
        let r = try send(c, request("/status/429")).get()
        XCTAssertEqual(r.status, 429)
        XCTAssertEqual(r.headers["retry-after"], "7")
        XCTAssertEqual(String(decoding: r.body, as: UTF8.self), #"{"reason":"Scripted"}"#)
        XCTAssertEqual(try send(c, request("/status/503")).get().status, 503)
    }

    func checkShutdownEndsWhatIsInFlightOrWaiting(_ c: any HTTPClient) throws {
        let results = LockedBox<[Result<CurlResponse, CurlFailure>]>([])
        let hang = { c.send(self.request("/hang", timeout: .seconds(60))) { r in results.update { $0.append(r) } } }
        hang()
        XCTAssertEqual(try send(c, request("/echo")).get().status, 200)
        XCTAssertEqual(c.inFlight, 1, "the hung request is on the wire")
        for _ in 0..<4 { hang() }  // two more on the wire, two waiting
        let t0 = ContinuousClock.now
        c.shutdown()
        XCTAssertLessThan(ContinuousClock.now - t0, .seconds(5))
        XCTAssertEqual(results.get().map(\.failure), Array(repeating: .stopped, count: 5), "all complete before shutdown returns")
        XCTAssertEqual(c.inFlight, 0)
        XCTAssertEqual(c.waiting, 0)
        XCTAssertEqual(try send(c, request("/echo")).failure, .stopped, "a stopped client sends nothing")
        c.shutdown()
    }

    func checkAClientCanBeStoppedFromItsOwnCompletion(_ c: any HTTPClient) throws {
        let hung = DispatchSemaphore(value: 0)
        let result = LockedBox<Result<CurlResponse, CurlFailure>?>(nil)
        c.send(request("/hang", timeout: .seconds(60))) { result.set($0); hung.signal() }
        let stopped = DispatchSemaphore(value: 0)
        c.send(request("/echo")) { _ in c.shutdown(); stopped.signal() }
        XCTAssertEqual(stopped.wait(timeout: .now() + 30), .success, "shutdown does not wait for the thread it runs on")
        XCTAssertEqual(hung.wait(timeout: .now() + 30), .success)
        XCTAssertEqual(result.get()?.failure, .stopped)
    }

    /// `make`: a client the test does not keep.
    func checkAClientLetGoStopsItsThread(_ make: () throws -> any HTTPClient) throws {
        let hung = DispatchSemaphore(value: 0)
        let result = LockedBox<Result<CurlResponse, CurlFailure>?>(nil)
        do {
            let c = try make()
            c.send(request("/hang", timeout: .seconds(60))) { result.set($0); hung.signal() }
            XCTAssertEqual(try send(c, request("/echo")).get().status, 200)
        }
        XCTAssertEqual(hung.wait(timeout: .now() + 30), .success, "the last reference's release stops the client")
        XCTAssertEqual(result.get()?.failure, .stopped)
    }
}

/// `r`'s status, or its failure, as one string.
func outcome(_ r: Result<CurlResponse, CurlFailure>) -> String {
    switch r {
    case .success(let answer): "\(answer.status)"
    case .failure(let failure): "\(failure)"
    }
}
