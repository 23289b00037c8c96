"""Passive flows: NetFlow/IPFIX records collected or imported, grouped into application
instances, and compared with iepm's own active tests."""
