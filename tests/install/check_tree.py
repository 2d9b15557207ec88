#!/usr/bin/env python3
"""Checks an installed kvpark tree (meson install --destdir) for consistency.

    check_tree.py DESTDIR PREFIX LIBDIR BINDIR SBINDIR DATADIR MANDIR INCLUDEDIR

Every path an installed systemd unit, man page, sysusers.d, tmpfiles.d or D-Bus
file names must exist in the tree, be made by one of them, or be a configuration
file whose example is installed and whose path the binary or unit really reads.
Exit status 0 when consistent, 1 with one line per problem.
"""
import gzip
import os
import re
import shlex
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

problems = []


def problem(text):
    if text in problems:
        return
    problems.append(text)
    print('FAIL: ' + text)


def join(dest, path):
    return os.path.join(dest, path.lstrip('/'))


(dest, prefix, libdir, bindir, sbindir, datadir, mandir, includedir) = sys.argv[1:9]


def under(d):
    return d if d.startswith('/') else os.path.join(prefix, d)


libdir, bindir, sbindir, datadir, mandir, includedir = map(
    under, (libdir, bindir, sbindir, datadir, mandir, includedir))
docdir = os.path.join(datadir, 'doc', 'kvpark')

# Where the readers look (systemd 252, dbus 1.14 as Debian 12 builds them).
UNIT_DIRS = ['/etc/systemd/system', '/usr/local/lib/systemd/system', '/lib/systemd/system',
             '/usr/lib/systemd/system']
SYSUSERS_DIRS = ['/etc/sysusers.d', '/usr/local/lib/sysusers.d', '/usr/lib/sysusers.d']
TMPFILES_DIRS = ['/etc/tmpfiles.d', '/usr/local/lib/tmpfiles.d', '/usr/lib/tmpfiles.d']
DBUS_POLICY_DIRS = ['/usr/share/dbus-1/system.d', '/etc/dbus-1/system.d']
DBUS_SERVICE_DIRS = ['/usr/local/share/dbus-1/system-services',
                     '/usr/share/dbus-1/system-services', '/lib/dbus-1/system-services']
# Directories that are the system's, named in man pages as places, not files of ours.
SYSTEM_PLACES = ['/run', '/dev/shm', '/tmp', '/proc', '/sys', '/var/tmp']


def tree_files():
    out = []
    for root, _, files in os.walk(dest):
        for f in files:
            out.append('/' + os.path.relpath(os.path.join(root, f), dest))
    return sorted(out)


files = tree_files()


def find_in(dirs, name):
    """The installed path of NAME in the first of DIRS holding it, else None."""
    for d in dirs:
        if os.path.join(d, name) in files:
            return os.path.join(d, name)
    return None


# 1. What a user needs is there; benchmarks are not.
expected = [
    os.path.join(sbindir, 'kvparkd'),
    os.path.join(bindir, 'kvparkctl'),
    os.path.join(bindir, 'kvpark-proxy'),
    os.path.join(bindir, 'kvpark-make-test-model'),
    os.path.join(libdir, 'libkvpark.a'),
    os.path.join(libdir, 'pkgconfig', 'kvpark.pc'),
    os.path.join(includedir, 'kvpark', 'kvpark.h'),
    os.path.join(includedir, 'kvpark', 'kvpark.hpp'),
    os.path.join(docdir, 'kvparkd.conf.example'),
    os.path.join(docdir, 'kvpark-proxy.conf.example'),
    os.path.join(docdir, '60-kvpark-hugepages.conf.example'),
    os.path.join(docdir, '60-kvpark-shmem-thp.conf.example'),
]
for path in expected:
    if path not in files:
        problem(f'{path} is not installed')
if not os.path.isdir(join(dest, '/etc/kvpark')):
    problem('/etc/kvpark (the configuration directory) is not installed')
for f in files:
    base = os.path.basename(f)
    if re.search(r'bench|replay', base):
        problem(f'benchmark {f} is installed (benchmarks run from the build tree)')
    if 'llama' in base and base != 'kvpark-make-test-model':
        problem(f'{f}: the llama.cpp integration is not installed')

units = {}
for name in ('kvparkd.service', 'kvpark-proxy.service'):
    path = find_in(UNIT_DIRS, name)
    if path is None:
        problem(f'{name} is not in a directory systemd reads ({", ".join(UNIT_DIRS)})')
    else:
        units[name] = path
sysusers = find_in(SYSUSERS_DIRS, 'kvpark.conf')
tmpfiles = find_in(TMPFILES_DIRS, 'kvpark.conf')
policy = find_in(DBUS_POLICY_DIRS, 'org.kvpark.Park1.conf')
activation = find_in(DBUS_SERVICE_DIRS, 'org.kvpark.Park1.service')
for what, got, dirs in (('sysusers.d kvpark.conf', sysusers, SYSUSERS_DIRS),
                        ('tmpfiles.d kvpark.conf', tmpfiles, TMPFILES_DIRS),
                        ('D-Bus policy org.kvpark.Park1.conf', policy, DBUS_POLICY_DIRS),
                        ('D-Bus activation org.kvpark.Park1.service', activation,
                         DBUS_SERVICE_DIRS)):
    if got is None:
        problem(f'{what} is not in a directory its reader reads ({", ".join(dirs)})')


def read(path):
    if path.endswith('.gz'):  # man pages in a Debian package
        with gzip.open(join(dest, path), 'rt', encoding='utf-8') as f:
            return f.read()
    with open(join(dest, path), encoding='utf-8') as f:
        return f.read()


def read_bytes(path):
    with open(join(dest, path), 'rb') as f:
        return f.read()


# 2. sysusers.d and tmpfiles.d: who exists, which directories are made.
users, groups = {'root'}, {'root'}
homes = {}
if sysusers:
    for line in read(sysusers).splitlines():
        fields = shlex.split(line, comments=True)
        if not fields:
            continue
        kind, name = fields[0], fields[1]
        if kind == 'u':
            users.add(name)
            groups.add(name)
            if len(fields) > 4 and fields[4] != '-':
                homes[name] = fields[4]
        elif kind == 'g':
            groups.add(name)
        elif kind == 'm':
            if fields[2] not in groups:
                problem(f'sysusers: {name} joins group {fields[2]}, which no line makes')
made_dirs = {}  # path -> (user, group)
if tmpfiles:
    for line in read(tmpfiles).splitlines():
        fields = line.split('#', 1)[0].split()
        if not fields:
            continue
        if fields[0] in ('d', 'D'):
            made_dirs[fields[1]] = (fields[3], fields[4])
            if fields[3] not in users:
                problem(f'tmpfiles: {fields[1]} belongs to user {fields[3]}, not made by sysusers')
            if fields[4] not in groups:
                problem(f'tmpfiles: {fields[1]} belongs to group {fields[4]}, not made by sysusers')
for user, home in homes.items():
    if made_dirs.get(home, (None,))[0] != user:
        problem(f'sysusers: home {home} of {user} is not made by tmpfiles.d with owner {user}')


# 3. Units.
def unit_settings(text):
    settings = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in '#;[' or '=' not in line:
            continue
        key, value = line.split('=', 1)
        settings.append((key.strip(), value.strip()))
    return settings


def man_page(name, section):
    """The installed path of a man page (gzipped in a Debian package), else its plain name."""
    path = os.path.join(mandir, f'man{section[0]}', f'{name}.{section}')
    return path + '.gz' if path + '.gz' in files else path


managed_dirs = set(made_dirs)  # places the units and tmpfiles.d make
config_paths = {}  # /etc path -> who reads it
binaries = []
for name, path in units.items():
    settings = unit_settings(read(path))
    # Mount points the unit makes for itself (TemporaryFileSystem=/path:options).
    unit_mounts = {word.split(':')[0] for key, value in settings
                   if key == 'TemporaryFileSystem' for word in value.split()}
    managed_dirs.update(unit_mounts)
    for key, value in settings:
        if key.startswith('Exec'):
            words = shlex.split(value)
            program = words[0].lstrip('@-:+!')
            if program in files:
                if program.startswith(sbindir) or program.startswith(bindir):
                    binaries.append(program)
            elif program.startswith(prefix + '/') or 'kvpark' in program:
                problem(f'{name}: {key}= {program} is not installed')
            elif not os.path.exists(program):
                problem(f'{name}: {key}= {program} exists neither in the tree nor on this system')
            for word in words[1:]:
                if word.startswith('/etc/'):
                    config_paths[word] = (name, os.path.basename(program))
                elif word.startswith('/') and word not in files and word not in unit_mounts:
                    problem(f'{name}: {key}= names {word}, which is not installed')
        elif key == 'Documentation':
            for doc in value.split():
                m = re.fullmatch(r'man:([\w.-]+)\((\w+)\)', doc)
                if not m:
                    problem(f'{name}: Documentation={doc} is not a man page')
                elif man_page(m.group(1), m.group(2)) not in files:
                    problem(f'{name}: Documentation={doc}: {man_page(m.group(1), m.group(2))} '
                            'is not installed')
        elif key == 'User' and value not in users:
            problem(f'{name}: User={value} is not made by sysusers.d')
        elif key == 'Group' and value not in groups:
            problem(f'{name}: Group={value} is not made by sysusers.d')
        elif key in ('RuntimeDirectory', 'StateDirectory', 'CacheDirectory'):
            base = {'RuntimeDirectory': '/run', 'StateDirectory': '/var/lib',
                    'CacheDirectory': '/var/cache'}[key]
            for d in value.split():
                managed_dirs.add(os.path.join(base, d))
        elif key in ('Wants', 'Requires', 'After', 'Before', 'BindsTo'):
            for other in value.split():
                if other.startswith('kvpark') and other not in units:
                    problem(f'{name}: {key}={other} is not installed')
        elif key == 'ConditionPathExists':
            if value.startswith('/etc/'):
                config_paths.setdefault(value, (name, None))
    # A configuration the unit needs but the package cannot ship (it names the
    # upstreams) must skip the unit, not fail it, while it is missing.
    for cpath, (unit, _) in config_paths.items():
        if unit == name and ('ConditionPathExists', cpath) not in settings:
            problem(f'{name}: reads {cpath} without ConditionPathExists={cpath}')

# A unit of ours with a RuntimeDirectory= of its own must name kvparkd's socket: the
# default socket path follows $RUNTIME_DIRECTORY (proto/paths.h), which systemd sets to
# that unit's own directory.
if 'kvparkd.service' in units:
    daemon = unit_settings(read(units['kvparkd.service']))
    daemon_run = next((v for k, v in daemon if k == 'RuntimeDirectory'), None)
    socket = f'/run/{daemon_run}/kvparkd.sock'
    for name, path in units.items():
        settings = unit_settings(read(path))
        if name == 'kvparkd.service' or not any(k == 'RuntimeDirectory' for k, _ in settings):
            continue
        env = [v for k, v in settings if k == 'Environment']
        if f'KVPARK_SOCKET={socket}' not in ' '.join(env).split():
            problem(f'{name}: RuntimeDirectory= without Environment=KVPARK_SOCKET={socket}: '
                    'it would look for kvparkd in its own runtime directory')

# kvparkd reads its configuration without being told: the path is compiled in.
kvparkd_bin = os.path.join(sbindir, 'kvparkd')
if kvparkd_bin in files:
    m = re.search(rb'(/etc/kvpark/[\w.-]+\.conf)\x00', read_bytes(kvparkd_bin))
    if m:
        config_paths[m.group(1).decode()] = ('kvparkd (compiled in)', 'kvparkd')
    else:
        problem(f'{kvparkd_bin}: no /etc/kvpark/*.conf path compiled in')

# Each configuration file has its example installed, naming the same path.
for cpath, (who, _) in sorted(config_paths.items()):
    example = os.path.join(docdir, os.path.basename(cpath) + '.example')
    if example not in files:
        problem(f'{cpath} (read by {who}) has no example {example}')
    elif not read(example).startswith(f'# {cpath}:'):
        problem(f'{example} does not name {cpath} on its first line')

# 4. Man pages: every path they name.
def installed(path):
    """PATH (file or directory) is in the tree; /lib and /usr/lib are one (merged /usr)."""
    aliases = [path]
    if path.startswith('/usr/lib/'):
        aliases.append(path[len('/usr'):])
    elif path.startswith('/lib/'):
        aliases.append('/usr' + path)
    return any(a in files or any(f.startswith(a + '/') for f in files) for a in aliases)



pages = [f for f in files if f.startswith(mandir + '/man')]
page_names = {os.path.basename(p).removesuffix('.gz') for p in pages}
for b in binaries + [os.path.join(bindir, 'kvparkctl'),
                     os.path.join(bindir, 'kvpark-make-test-model')]:
    sect = '8' if b.startswith(sbindir) else '1'
    if f'{os.path.basename(b)}.{sect}' not in page_names:
        problem(f'{b} has no man page {os.path.basename(b)}({sect})')
for page in pages:
    text = read(page)
    for m in re.finditer(r'^\.(?:It )?Xr ([\w.-]+) (\d\w*)', text, re.M):
        ref_name, ref_sect = m.group(1), m.group(2)
        if (ref_name.startswith('kvpark') or ref_name.startswith('libkvpark')) \
                and man_page(ref_name, ref_sect) not in files:
            problem(f'{page}: refers to {ref_name}({ref_sect}), which is not installed')
    for m in re.finditer(r'^\.(?:It )?Pa (/[^\s]*)', text, re.M):
        path = m.group(1).rstrip('/')
        if any(path == p or path.startswith(p + '/') for p in SYSTEM_PLACES) and \
                not any(path == d or path.startswith(d + '/') for d in managed_dirs):
            if not re.match(r'/(run|var/lib|var/cache)/kvpark', path):
                continue  # the system's own places (/run, /dev/shm/...)
        if path.startswith('/etc/kvpark/'):
            if path not in config_paths:
                problem(f'{page}: names {path}, which no unit or binary reads')
        elif path.startswith('/usr/') or path.startswith(prefix + '/'):
            if prefix != '/usr' and path.startswith('/usr/') and not path.startswith(prefix):
                print(f'note: {page} names {path}; prefix is {prefix}, not checked')
            elif not installed(path):
                problem(f'{page}: names {path}, which is not installed')
        elif re.match(r'/(run|var/lib|var/cache)/', path):
            if not any(path == d or path.startswith(d + '/') for d in managed_dirs):
                problem(f'{page}: names {path}, which no unit or tmpfiles.d line makes')

# 5. D-Bus: the policy lets the daemon's user own the name the activation file names,
# and the activation file starts an installed unit.
if policy and activation:
    try:
        root = ET.fromstring(read(policy))
        owners = set()
        for pol in root.iter('policy'):
            for attr in ('user', 'group'):
                who = pol.get(attr)
                if who and who not in (users if attr == 'user' else groups):
                    problem(f'{policy}: policy {attr}="{who}" is not made by sysusers.d')
            for allow in pol.iter('allow'):
                if allow.get('own'):
                    owners.add((pol.get('user'), allow.get('own')))
        act = dict(line.split('=', 1) for line in read(activation).splitlines()
                   if '=' in line and not line.startswith('#'))
        bus_name = act.get('Name')
        daemon_user = next((v for k, v in unit_settings(read(units['kvparkd.service']))
                            if k == 'User'), None) if 'kvparkd.service' in units else None
        if (daemon_user, bus_name) not in owners:
            problem(f'{policy}: user {daemon_user} may not own {bus_name}')
        if os.path.basename(policy) != f'{bus_name}.conf':
            problem(f'{policy}: not named after the bus name {bus_name}')
        if act.get('SystemdService') not in units:
            problem(f'{activation}: SystemdService={act.get("SystemdService")} is not installed')
    except ET.ParseError as e:
        problem(f'{policy}: not XML: {e}')

# 6. pkg-config and headers: a C and a C++ engine build and link against the tree alone.
pc = os.path.join(libdir, 'pkgconfig', 'kvpark.pc')
if pc in files:
    env = dict(os.environ, PKG_CONFIG_PATH=join(dest, os.path.dirname(pc)),
               PKG_CONFIG_SYSROOT_DIR=dest, PKG_CONFIG_LIBDIR=join(dest, os.path.dirname(pc)) +
               ':/usr/lib/x86_64-linux-gnu/pkgconfig:/usr/share/pkgconfig:/usr/lib/pkgconfig')
    flags = subprocess.run(['pkg-config', '--cflags', '--libs', 'kvpark'], env=env,
                           capture_output=True, text=True)
    if flags.returncode != 0:
        problem(f'pkg-config kvpark: {flags.stderr.strip()}')
    else:
        with tempfile.TemporaryDirectory() as work:
            sources = {
                # kvpark_connect pulls in the library's objects, and with them its C++.
                'engine.c': '#include <kvpark.h>\n'
                            'int main(void) { return kvpark_connect != 0 &&\n'
                            '    kvpark_status_string((kvpark_status)0) != 0 ? 0 : 1; }\n',
                'engine.cpp': '#include <kvpark.hpp>\n'
                              'int main() { return kvpark_connect != nullptr ? 0 : 1; }\n',
            }
            for src, body in sources.items():
                with open(os.path.join(work, src), 'w') as f:
                    f.write(body)
                compiler = ['cc'] if src.endswith('.c') else ['c++', '-std=c++20']
                cmd = compiler + [os.path.join(work, src), '-o', os.path.join(work, 'engine')] + \
                    shlex.split(flags.stdout)
                built = subprocess.run(cmd, capture_output=True, text=True)
                if built.returncode != 0:
                    problem(f'an engine ({src}) does not build against the tree with '
                            f'`pkg-config --cflags --libs kvpark`: {" ".join(cmd)}\n'
                            + built.stderr[-2000:])

print(f'{len(files)} files installed; {len(problems)} problems')
sys.exit(1 if problems else 0)
