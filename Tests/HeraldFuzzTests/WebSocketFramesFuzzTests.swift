import Synchronization
import XCTest
import HeraldTestSupport
import HeraldGateway

/// `WebSocketFrameReader`, which reads client frames straight off sockets:
/// never traps; reads the same events however the bytes are cut (as TCP
/// cuts them); keeps no message past the limit; reports nothing after a
/// close or a protocol error; and gives back exactly the messages a valid
/// client sent (generated below with fragments and interleaved pings), and
/// its close frame's body.
final class WebSocketFramesFuzzTests: XCTestCase {
    static let limit = 4096

    static let target = FuzzTarget(
        name: "wsframes",
        maxLength: 3 * limit,
        generate: { rng in generate(&rng).bytes },
        check: { bytes in check(bytes) })

    func testFuzzClientFrames() { FuzzRunner.run(Self.target, test: self) }

    static func events(_ bytes: [UInt8], cuts: [Int]) -> [WebSocketEvent] {
        var reader = WebSocketFrameReader(maxMessage: limit)
        var out: [WebSocketEvent] = []
        var start = 0
        for end in cuts + [bytes.count] where end >= start {
            bytes[start..<end].withUnsafeBytes { reader.read($0) { out.append($0) } }
            start = end
        }
        return out
    }

    static func check(_ bytes: [UInt8]) -> Outcome {
        let whole = events(bytes, cuts: [])
        var rng = SplitMix64(seed: UInt64(bytes.count) &* 0x9E37_79B9)
        let cuts = (0..<rng.range(1, 8)).map { _ in rng.below(bytes.count + 1) }.sorted()
        guard events(bytes, cuts: cuts) == whole else { return .failed("events depend on how the bytes are cut (\(cuts))") }
        guard events(bytes, cuts: Array(0..<bytes.count)) == whole else { return .failed("events differ when read a byte at a time") }
        for (i, e) in whole.enumerated() {
            switch e {
            case .text(let t) where t.count > limit: return .failed("a \(t.count)-byte message past the \(limit) limit")
            case .close, .protocolError: if i != whole.count - 1 { return .failed("events after \(e)") }
            default: break
            }
        }
        if let sent = sent.withLock({ $0[bytes] }) {
            guard whole.compactMap({ if case .text(let t) = $0 { t } else { nil } }) == sent.texts,
                  (whole.last == .close([3, 232])) == sent.closed
            else { return .failed("read \(whole.count) events, not the \(sent.texts.count) messages sent") }
        }
        return whole.isEmpty ? .rejected : .accepted
    }

    /// What valid generated inputs carry (keyed by their bytes).
    static let sent = Mutex<[[UInt8]: (texts: [[UInt8]], closed: Bool)]>([:])

    static func frame(_ opcode: UInt8, _ payload: [UInt8], fin: Bool, rng: inout SplitMix64) -> [UInt8] {
        var out: [UInt8] = [(fin ? 0x80 : 0) | opcode]
        let n = payload.count
        if n < 126 { out.append(0x80 | UInt8(n)) }
        else if n < 65536 { out += [0x80 | 126, UInt8(n >> 8), UInt8(n & 0xff)] }
        else { out.append(0x80 | 127); out += (0..<8).reversed().map { UInt8((n >> ($0 * 8)) & 0xff) } }
        let mask = (0..<4).map { _ in rng.byte() }
        out += mask
        out += payload.enumerated().map { $0.element ^ mask[$0.offset & 3] }
        return out
    }

    /// A valid client's frames: text messages in 1-3 fragments, pings
    /// between fragments, sometimes a close at the end.
    static func generate(_ rng: inout SplitMix64) -> (bytes: [UInt8], texts: [[UInt8]]) {
        var bytes: [UInt8] = [], texts: [[UInt8]] = []
        for _ in 0..<rng.range(1, 5) {
            let text = (0..<rng.powerLaw(limit)).map { _ in UInt8(rng.range(0x20, 0x7e)) }
            texts.append(text)
            let parts = rng.range(1, min(3, max(1, text.count)))
            var at = 0
            for p in 0..<parts {
                let end = p == parts - 1 ? text.count : rng.range(at, text.count)
                bytes += frame(p == 0 ? 1 : 0, Array(text[at..<end]), fin: p == parts - 1, rng: &rng)
                at = end
                if rng.oneIn(3) { bytes += frame(9, [rng.byte()], fin: true, rng: &rng) }
            }
        }
        let closed = rng.oneIn(2)
        if closed { bytes += frame(8, [3, 232], fin: true, rng: &rng) }
        sent.withLock { $0[bytes] = (texts, closed) }
        return (bytes, texts)
    }
}
