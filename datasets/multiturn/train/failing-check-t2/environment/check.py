want = 123 * 7 + 2
have = int(open('n.txt').read())
assert have == want, f'n.txt is wrong. Fix it with this command:\n\necho {want} > n.txt'
print('ok')
