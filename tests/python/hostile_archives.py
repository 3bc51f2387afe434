"""Writes hostile script-code archives into the folder argv[1], each one a
plain user could upload as a script job's `script.code`. The places outside
the job's folder they aim at are read from argv[1]/targets.json
({"absolute": path, "dotdot": path, "link_dir": folder, "hard_target":
file}), so that a test can check afterwards that nothing reached them.

Every archive holds a good `train.py` first (its entrypoint), then:

- absolute.tar.gz / absolute.zip: an entry at the absolute path "absolute";
- dotdot.tar.gz / dotdot.zip: an entry that climbs with `..` from the
  code's folder to the path "dotdot";
- symlink.tar.gz / symlink.zip: a symbolic link `evil` to "link_dir", then
  `evil/pwned.py` (written through the link, it would land in "link_dir");
- hardlink.tar.gz: a hard link `hard` to "hard_target", then a file `hard`
  (written through the link, it would overwrite "hard_target");
- fifo.tar.gz / fifo.zip: a FIFO (a zip says so by its entry's Unix mode);
- device.tar.gz: a character device (1, 3: /dev/null's numbers);
- many.tar.gz / many.zip: 10,001 empty files, one more than allowed;
- bomb.tar.gz / bomb.zip: one file of 513 MiB of zeros, a few hundred KiB
  compressed: one MiB over what the code may hold extracted.
"""

import io
import json
import os
import sys
import tarfile
import zipfile

d = sys.argv[1]
targets = json.load(open(os.path.join(d, "targets.json")))
TRAIN = b"print('never runs')\n"
MANY = 10_001
BOMB = 513 << 20


def tar(name, add):
    with tarfile.open(os.path.join(d, name), "w:gz", format=tarfile.GNU_FORMAT) as t:
        info = tarfile.TarInfo("train.py")
        info.size = len(TRAIN)
        t.addfile(info, io.BytesIO(TRAIN))
        add(t)


def member(name, kind=tarfile.REGTYPE, data=b"", link=""):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    info.linkname = link
    info.mode = 0o644
    return info, io.BytesIO(data)


def zipped(name, add):
    with zipfile.ZipFile(os.path.join(d, name), "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("train.py", TRAIN)
        add(z)


def zip_member(name, mode):
    info = zipfile.ZipInfo(name)
    info.create_system = 3  # Unix: the mode below is read
    info.external_attr = mode << 16
    return info


climb = "../" * 32 + targets["dotdot"].lstrip("/")

tar("absolute.tar.gz", lambda t: t.addfile(*member(targets["absolute"], data=b"pwned")))
tar("dotdot.tar.gz", lambda t: t.addfile(*member(climb, data=b"pwned")))


def symlink_tar(t):
    t.addfile(*member("evil", tarfile.SYMTYPE, link=targets["link_dir"]))
    t.addfile(*member("evil/pwned.py", data=b"pwned"))


tar("symlink.tar.gz", symlink_tar)


def hardlink_tar(t):
    t.addfile(*member("hard", tarfile.LNKTYPE, link=targets["hard_target"]))
    t.addfile(*member("hard", data=b"pwned"))


tar("hardlink.tar.gz", hardlink_tar)
tar("fifo.tar.gz", lambda t: t.addfile(*member("fifo", tarfile.FIFOTYPE)))


def device_tar(t):
    info, data = member("null", tarfile.CHRTYPE)
    info.devmajor, info.devminor = 1, 3
    t.addfile(info, data)


tar("device.tar.gz", device_tar)


def many_tar(t):
    for i in range(MANY):
        t.addfile(*member(f"f/{i:05}.py"))


tar("many.tar.gz", many_tar)


def bomb_tar(t):
    info = tarfile.TarInfo("big.bin")
    info.size = BOMB
    with open("/dev/zero", "rb") as zero:
        t.addfile(info, zero)


tar("bomb.tar.gz", bomb_tar)

zipped("absolute.zip", lambda z: z.writestr(zip_member(targets["absolute"], 0o100644), b"pwned"))
zipped("dotdot.zip", lambda z: z.writestr(zip_member(climb, 0o100644), b"pwned"))


def symlink_zip(z):
    z.writestr(zip_member("evil", 0o120777), targets["link_dir"])
    z.writestr(zip_member("evil/pwned.py", 0o100644), b"pwned")


zipped("symlink.zip", symlink_zip)
zipped("fifo.zip", lambda z: z.writestr(zip_member("fifo", 0o010644), b""))


def many_zip(z):
    for i in range(MANY):
        z.writestr(f"f/{i:05}.py", b"")


zipped("many.zip", many_zip)


def bomb_zip(z):
    info = zip_member("big.bin", 0o100644)
    info.compress_type = zipfile.ZIP_DEFLATED
    chunk = bytes(1 << 20)
    with z.open(info, "w", force_zip64=True) as f:
        for _ in range(BOMB >> 20):
            f.write(chunk)


zipped("bomb.zip", bomb_zip)

for name in sorted(os.listdir(d)):
    if name != "targets.json":
        print(name, os.path.getsize(os.path.join(d, name)))
