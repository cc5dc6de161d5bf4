import XCTest
@testable import HeraldRedis

/// The bus's queues: first in, first out, through the compactions that keep
/// `removeFirst` cheap.
final class FIFOTests: XCTestCase {
    func testElementsLeaveInTheOrderTheyCameThroughCompactions() {
        var q = FIFO<Int>()
        var expected: [Int] = []
        var next = 0
        // Appends and removals interleaved, so the list is compacted both
        // when it empties and when the taken part is the larger one.
        for round in 0..<50 {
            for _ in 0..<(100 * (round % 7 + 1)) {
                q.append(contentsOf: [next])
                expected.append(next)
                next += 1
            }
            let n = min(q.count, 90 * (round % 5 + 2))
            XCTAssertEqual(q.elements.first, expected.first)
            q.removeFirst(n)
            expected.removeFirst(n)
            XCTAssertEqual(q.count, expected.count)
            XCTAssertEqual(Array(q.elements), expected)
        }
        q.removeFirst(q.count)
        XCTAssertTrue(q.isEmpty)
        XCTAssertNil(q.elements.first)
        q.append(contentsOf: [1, 2])
        XCTAssertEqual(Array(q.elements), [1, 2])
        q.removeAll()
        XCTAssertTrue(q.isEmpty)
    }
}
