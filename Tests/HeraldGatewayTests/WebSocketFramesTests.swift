import XCTest
@testable import HeraldGateway

/// RFC 6455 section 5 rules the reader enforces, one case each.
final class WebSocketFramesTests: XCTestCase {
    func frame(_ b0: UInt8, _ payload: [UInt8], masked: Bool = true, length: [UInt8]? = nil) -> [UInt8] {
        let mask: [UInt8] = [9, 8, 7, 6]
        let len = length ?? (payload.count < 126 ? [UInt8(payload.count)] : [126, UInt8(payload.count >> 8), UInt8(payload.count & 0xff)])
        return [b0, (masked ? 0x80 : 0) | len[0]] + len.dropFirst() + (masked ? mask : [])
            + payload.enumerated().map { masked ? $0.element ^ mask[$0.offset & 3] : $0.element }
    }

    func read(_ bytes: [UInt8], max: Int = 100) -> [WebSocketEvent] {
        var r = WebSocketFrameReader(maxMessage: max)
        var out: [WebSocketEvent] = []
        bytes.withUnsafeBytes { r.read($0) { out.append($0) } }
        return out
    }

    func testMessagesFragmentsAndControlFrames() {
        let t = Array("hello".utf8)
        XCTAssertEqual(read(frame(0x81, t)), [.text(t)])
        XCTAssertEqual(read(frame(0x01, [104, 101]) + frame(0x89, [7]) + frame(0x80, [108, 108, 111])), [.ping([7]), .text(t)])
        XCTAssertEqual(read(frame(0x8A, []) + frame(0x81, [])), [.pong, .text([])])
        XCTAssertEqual(read(frame(0x88, [3, 232]) + frame(0x81, t)), [.close], "nothing is read after a close")
        XCTAssertEqual(read(frame(0x82, [1, 2]) + frame(0x81, t)), [.binary, .text(t)], "a binary message is skipped")
    }

    func testLimitCountsFragmentsTogether() {
        let half = [UInt8](repeating: 65, count: 60)
        XCTAssertEqual(read(frame(0x01, half) + frame(0x80, half) + frame(0x81, [66])), [.tooBig, .text([66])])
        XCTAssertEqual(read(frame(0x81, half + half.prefix(40))), [.text(half + half.prefix(40))], "exactly the limit is taken")
    }

    func testTheLargestLengthAfterAFragmentIsTooBigNotAnOverflow() {
        // 2^63 - 1 bytes announced behind one byte of the message: the sum
        // of the two does not fit an Int.
        let largest: [UInt8] = [127, 0x7F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]
        XCTAssertEqual(read(frame(0x01, [97]) + frame(0x80, [], length: largest)), [.tooBig])
        XCTAssertEqual(read(frame(0x81, [], length: largest)), [.tooBig])
    }

    func testCloseReasonsAreCutAtACharacter() {
        for reason in [String(repeating: "é", count: 70), "x" + String(repeating: "é", count: 70), String(repeating: "😀", count: 40)] {
            let cut = WebSocketSession.closeReason(reason)
            XCTAssertLessThanOrEqual(cut.utf8.count, 120)
            XCTAssertGreaterThan(cut.utf8.count, 116, "only the partial character goes")
            XCTAssertTrue(reason.hasPrefix(cut))
        }
        XCTAssertEqual(WebSocketSession.closeReason("short"), "short")
    }

    func testFramingErrors() {
        func refused(_ bytes: [UInt8], _ why: String) {
            guard case .protocolError(let m)? = read(bytes).last, m.contains(why) else {
                return XCTFail("\(read(bytes)) is not a protocol error about \(why)")
            }
        }
        refused(frame(0x81, [1], masked: false), "masked")
        refused(frame(0xC1, [1]), "reserved")
        refused(frame(0x83, [1]), "opcode")
        refused(frame(0x80, [1]), "continuation")
        refused(frame(0x01, [1]) + frame(0x81, [1]), "inside a fragmented")
        refused(frame(0x09, [1]), "control frames")
        refused(frame(0x89, [UInt8](repeating: 0, count: 126)), "control frames")
        refused(frame(0x81, [], length: [127, 0x80, 0, 0, 0, 0, 0, 0, 0]), "length")
    }
}
