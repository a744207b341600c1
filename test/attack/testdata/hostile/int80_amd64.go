package main

// int80 makes an i386 system call (int $0x80) and returns the raw result
// (a negative errno on failure).
func int80(trap, a1, a2, a3 uintptr) (r uintptr)

const haveInt80 = true
