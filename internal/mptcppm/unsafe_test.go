package mptcppm_test

import "unsafe"

func unsafePointer(b []byte) unsafe.Pointer    { return unsafe.Pointer(&b[0]) }
func unsafePointer32(p *uint32) unsafe.Pointer { return unsafe.Pointer(p) }
