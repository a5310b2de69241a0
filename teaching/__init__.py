"""The teaching tools: ``obfsproxy.py demo``, ``unmask`` and ``detect``.

Nothing at the root imports this folder except ``obfsproxy.py``, and only when one of
those three commands runs: the root's ``*.py`` carry a tunnel alone (client, server,
managed), so a machine that only serves traffic needs just them.

    demo.py            the annotated walk through one connection, and its generic walk
    demo_base.py       running that connection with its wire recorded; the seeded draws
    demo_obfs.py       the walks through obfs2, obfs3 and obfs4
    demo_webtunnel.py  the walk through webtunnel, with the certificate the demo makes
    present.py         the terminal presentation: hex dumps, field rows, colours
    pictures.py        --html: what the three commands showed, drawn on one page
    svg.py             the drawings as inline SVG: axes, stems, strips, gauges
    capture.py         the passive attacks: ``unmask`` and ``detect``
    pcap.py            reading captures: pcap, IP/TCP, reassembly, recordings
    tlswire.py         TLS records, the ClientHello, SNI and JA4
"""
