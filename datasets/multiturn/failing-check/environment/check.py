want = 126 * 7 + 2
have = int(open('n.txt').read())
assert have == want, f'expected {want}, got {have}'
print('ok')
