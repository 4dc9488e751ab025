/* vkshmem core native helper: hardware atomics and copies on symmetric segments.
 *
 * Every path that applies an AMO to host memory (this PE, a same-node peer through the shm
 * path, a transport's progress thread serving a remote request) goes through vk_amo, so AMOs
 * arriving by different paths on the same word are atomic with each other.
 * Op codes match vkshmem.core.transport.AmoOp.
 */
#include <stdint.h>

#define VK_OFF_MASK ((1ull << 48) - 1)
#define VK_SENTINEL 0xA5A5A5A5A5A5A5A5ull

enum { VK_FETCH = 0, VK_SET, VK_SWAP, VK_CSWAP, VK_ADD, VK_AND, VK_OR, VK_XOR };

typedef uint64_t (*vk_amo_fn)(uintptr_t addr, int op, int width, uint64_t operand,
                              uint64_t compare);
