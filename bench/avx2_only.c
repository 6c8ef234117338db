/* Preloaded by `python -m bench.avx2_only`: the process (and the threads it starts) sees
 * the CPU as one without AVX-512, AMX or AVX-VNNI, so every library that picks kernels at
 * run time (ONNX Runtime's MLAS, embedder_rs, gemm, numpy) picks the ones it would pick on
 * an AVX2 + FMA CPU.
 *
 * Linux's CPUID faulting (arch_prctl ARCH_SET_CPUID, 0; the `cpuid_fault` flag) makes the
 * CPUID instruction raise SIGSEGV in this thread and the threads it creates. The handler
 * answers it: CPUID is allowed again for the one instruction, run, the feature bits
 * cleared, the instruction skipped. Any other SIGSEGV goes to whatever handler the program
 * installed (sigaction is wrapped so that one cannot displace this one), else the default.
 */
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

static struct sigaction program_handler; /* the program's own SIGSEGV handler */
static volatile uint64_t answered;       /* CPUID instructions answered, for the report */
static volatile int active;

/* Leaf 7 sub-leaf 0: EBX AVX512F, DQ, IFMA, PF, ER, CD, BW, VL; ECX VBMI, VBMI2, VNNI,
 * BITALG, VPOPCNTDQ; EDX 4VNNIW, 4FMAPS, VP2INTERSECT, AMX-BF16, AVX512-FP16, AMX-TILE,
 * AMX-INT8. Sub-leaf 1: EAX AVX-VNNI, AVX512-BF16. */
#define BIT(n) (1u << (n))
static const uint32_t L7_EBX = BIT(16) | BIT(17) | BIT(21) | BIT(26) | BIT(27) | BIT(28) |
                               BIT(30) | BIT(31);
static const uint32_t L7_ECX = BIT(1) | BIT(6) | BIT(11) | BIT(12) | BIT(14);
static const uint32_t L7_EDX = BIT(2) | BIT(3) | BIT(8) | BIT(22) | BIT(23) | BIT(24) | BIT(25);
static const uint32_t L7S1_EAX = BIT(4) | BIT(5);

uint64_t ragplane_avx2_only_answered(void) { return answered; }
int ragplane_avx2_only_active(void) { return active; }

static int real_sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
  static int (*next)(int, const struct sigaction *, struct sigaction *);
  if (!next) next = dlsym(RTLD_NEXT, "sigaction");
  return next(sig, act, old);
}

static void pass_on(int sig, siginfo_t *info, void *uc) {
  struct sigaction h = program_handler;
  if ((h.sa_flags & SA_SIGINFO) && h.sa_sigaction) {
    h.sa_sigaction(sig, info, uc);
  } else if (h.sa_handler != SIG_DFL && h.sa_handler != SIG_IGN && h.sa_handler) {
    h.sa_handler(sig);
  } else { /* the default: die of the signal, as without this library */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    real_sigaction(SIGSEGV, &dfl, NULL);
  }
}

static void on_segv(int sig, siginfo_t *info, void *uc_) {
  ucontext_t *uc = uc_;
  greg_t *r = uc->uc_mcontext.gregs;
  const uint8_t *ip = (const uint8_t *)r[REG_RIP];
  if (info->si_code != SI_KERNEL || ip[0] != 0x0f || ip[1] != 0xa2) {
    pass_on(sig, info, uc_);
    return;
  }
  uint32_t leaf = (uint32_t)r[REG_RAX], sub = (uint32_t)r[REG_RCX], a, b, c, d;
  syscall(SYS_arch_prctl, ARCH_SET_CPUID, 1);
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(leaf), "c"(sub));
  syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0);
  if (leaf == 7 && sub == 0) {
    b &= ~L7_EBX;
    c &= ~L7_ECX;
    d &= ~L7_EDX;
  } else if (leaf == 7 && sub == 1) {
    a &= ~L7S1_EAX;
  }
  r[REG_RAX] = a;
  r[REG_RBX] = b;
  r[REG_RCX] = c;
  r[REG_RDX] = d;
  r[REG_RIP] += 2;
  answered++;
}

/* The program's SIGSEGV handler is kept and called for every other fault. */
int sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
  if (sig != SIGSEGV || !active) return real_sigaction(sig, act, old);
  if (old) *old = program_handler;
  if (act) program_handler = *act;
  return 0;
}

__attribute__((constructor)) static void start(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
  if (real_sigaction(SIGSEGV, &sa, &program_handler) != 0) {
    perror("avx2_only: sigaction");
    return;
  }
  if (syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0) != 0) {
    perror("avx2_only: CPUID faulting (arch_prctl ARCH_SET_CPUID)");
    real_sigaction(SIGSEGV, &program_handler, NULL);
    return;
  }
  active = 1;
}
