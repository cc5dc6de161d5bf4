import HeraldCore
import HeraldPorts
import XCTest
@testable import HeraldPush

/// Where the store would be: keeps one token, and answers the asks only
/// when the test says (as the engine answers once its batch committed),
/// as `SharedTokens` promises: the kept token while younger than
/// `renewAfter`, else the one `make` signs.
final class HeldTokens: SharedTokens {
    private struct Ask {
        let renewAfter: Millis
        let make: @Sendable (Millis) -> String
        let completion: @Sendable (SharedToken?) -> Void
    }

    private struct State {
        var kept: SharedToken?
        var waiting: [Ask] = []
        /// Each ask's `renewAfter`.
        var asked: [Millis] = []
    }

    private let state = Locked(State())

    func token(_ name: String, renewAfter: Millis, make: @escaping @Sendable (Millis) -> String,
               completion: @escaping @Sendable (SharedToken?) -> Void) {
        state.withLock { s in
            s.asked.append(renewAfter)
            s.waiting.append(Ask(renewAfter: renewAfter, make: make, completion: completion))
        }
    }

    var asked: [Millis] { state.withLock { $0.asked } }
    var asks: Int { asked.count }

    /// Answers every ask waiting as the store would at `now`; nil: as a store that cannot be reached.
    func answer(now: Millis?) {
        let asks = state.withLock { s in defer { s.waiting = [] }; return s.waiting }
        for a in asks {
            let token: SharedToken? = now.map { now in
                state.withLock { s in
                    if let k = s.kept, now - k.issuedAt < a.renewAfter { return k }
                    let made = SharedToken(value: a.make(now), issuedAt: now)
                    s.kept = made
                    return made
                }
            }
            a.completion(token)
        }
    }
}

/// `ProviderToken`: the copy each process keeps of the deployment's one
/// APNs provider token, asked of the store once per renewal.
final class ProviderTokenTests: XCTestCase {
    static let t0: Millis = 1_800_000_000_000
    static let minute: Millis = 60_000
    let tokens = HeldTokens()

    func providerToken() throws -> ProviderToken {
        ProviderToken(teamId: "TEAM123456", keyId: "KEY1234567", key: try ES256Key(pem: p256PKCS8))
    }

    /// Calls `use` and waits for its token, answering the store at `answer` if it asked.
    func token(_ p: ProviderToken, now: Millis, answer: Millis?? = nil) -> String? {
        let got = expectation(description: "the token")
        let value = Locked<String?>(nil)
        p.use(now: now, in: tokens) { jwt in
            value.withLock { $0 = jwt }
            got.fulfill()
        }
        if let answer { tokens.answer(now: answer) }
        wait(for: [got], timeout: 10)
        return value.withLock { $0 }
    }

    func testSendsWaitingForTheStoreShareOneAnswerAndTheCopyServesUntilDue() throws {
        let p = try providerToken()
        let got = expectation(description: "three sends")
        got.expectedFulfillmentCount = 3
        let values = Locked<[String?]>([])
        for _ in 0..<3 {
            p.use(now: Self.t0, in: tokens) { jwt in
                values.withLock { $0.append(jwt) }
                got.fulfill()
            }
        }
        XCTAssertEqual(tokens.asks, 1, "one ask for the sends waiting together")
        tokens.answer(now: Self.t0)
        wait(for: [got], timeout: 10)
        let first = try XCTUnwrap(values.withLock { $0 }.first ?? nil)
        XCTAssertEqual(values.withLock { $0 }, [first, first, first])
        let claims = try XCTUnwrap(JSONParser.parse(Base64URL.decode(Substring(first.split(separator: ".")[1]))!).objectValue)
        XCTAssertEqual(claims["iss"], "TEAM123456")
        XCTAssertEqual(claims["iat"], .int(Self.t0 / 1000))

        XCTAssertEqual(token(p, now: Self.t0 + 40 * Self.minute - 1), first, "the copy, not yet due")
        XCTAssertEqual(tokens.asks, 1)
        let renewed = token(p, now: Self.t0 + 40 * Self.minute, answer: Self.t0 + 40 * Self.minute)
        XCTAssertNotEqual(renewed, first, "due at 40 minutes")
        XCTAssertEqual(tokens.asked, [ProviderToken.renewEvery, ProviderToken.renewEvery])
    }

    func testAnotherProcessTakesTheTokenKeptRatherThanMakeOne() throws {
        let first = token(try providerToken(), now: Self.t0, answer: Self.t0)
        XCTAssertEqual(token(try providerToken(), now: Self.t0 + 5 * Self.minute, answer: Self.t0 + 5 * Self.minute), first)
    }

    func testATokenAppleCalledExpiredIsRenewedOnceTwentyMinutesOld() throws {
        let p = try providerToken()
        let first = try XCTUnwrap(token(p, now: Self.t0, answer: Self.t0))
        p.expired("another token")
        XCTAssertEqual(token(p, now: Self.t0 + 25 * Self.minute), first, "only the token Apple refused")
        p.expired(first)
        XCTAssertEqual(token(p, now: Self.t0 + 19 * Self.minute), first, "no sooner than Apple takes a new one")
        XCTAssertNotEqual(token(p, now: Self.t0 + 25 * Self.minute, answer: Self.t0 + 25 * Self.minute), first)
        XCTAssertEqual(tokens.asked, [ProviderToken.renewEvery, ProviderToken.renewAtMostEvery])
        XCTAssertNotNil(token(p, now: Self.t0 + 60 * Self.minute), "a new token is renewed every 40 minutes again")
        XCTAssertEqual(tokens.asks, 2)
    }

    func testAStoreThatDoesNotAnswerGivesNoTokenAndIsAskedAgain() throws {
        let p = try providerToken()
        XCTAssertNil(token(p, now: Self.t0, answer: .some(nil)))
        XCTAssertNotNil(token(p, now: Self.t0 + 1_000, answer: Self.t0 + 1_000))
        XCTAssertEqual(tokens.asks, 2)
    }
}
